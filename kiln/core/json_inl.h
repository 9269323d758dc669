#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kiln/core/error.h"

namespace kiln {

template <class T>
T get_or(const Json& j, const char* key, const T& fallback) {
  if (!j.is_object()) return fallback;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    static_assert(sizeof(T) <= sizeof(int64_t));
    if (it->is_number())  // range-checked: nlohmann's conversion wraps or is undefined out of range
      return static_cast<T>(
          json_integer(*it, static_cast<int64_t>(std::numeric_limits<T>::min()),
                       static_cast<int64_t>(std::min<uint64_t>(std::numeric_limits<T>::max(), INT64_MAX)),
                       std::string("config key `") + key + "`", ": " + it->dump()));
  }
  try {
    return it->template get<T>();
  } catch (const nlohmann::json::exception& e) {
    throw ValueError(std::string("config key `") + key + "` has the wrong type (" + it->type_name() +
                     "): " + it->dump());
  }
}

}  // namespace kiln
