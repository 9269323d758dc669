#pragma once

#include "kiln/core/error.h"

namespace kiln {

template <class T>
T get_or(const Json& j, const char* key, const T& fallback) {
  if (!j.is_object()) return fallback;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  try {
    return it->template get<T>();
  } catch (const nlohmann::json::exception& e) {
    throw ValueError(std::string("config key `") + key + "` has the wrong type (" + it->type_name() +
                     "): " + it->dump());
  }
}

}  // namespace kiln
