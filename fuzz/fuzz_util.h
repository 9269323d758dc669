// Shared by the fuzz targets (libFuzzer, built with -DKILN_FUZZ=ON; see
// docs/FUZZING.md).
//
// Every target feeds bytes to one parser of untrusted input and accepts only
// kiln's own errors (kiln::Error: the one clear message a user sees). Any
// other exception (a raw JSON type error, a LibTorch c10::Error, bad_alloc)
// escapes the harness and libFuzzer reports it as a crash: it would surface
// as "internal error" instead of a message naming the problem. ASan/UBSan
// reports, stack overflows, timeouts and memory blow-ups are crashes too.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "kiln/core/error.h"
#include "kiln/core/json.h"

namespace kiln::fuzz {

// Runs `body`, swallowing kiln::Error (the expected outcome of bad input).
template <class F>
void expect_kiln_errors_only(F&& body) {
  try {
    body();
  } catch (const kiln::Error&) {
  }
}

// True when every number in `j` is at most `limit` in magnitude. Configs that
// pass are worth building: a layer of 10^9 units is a legitimate request that
// allocates what it asks for, which the fuzzer would otherwise report as
// running out of memory instead of exploring the parser. Depth is bounded by
// parse_json before this walk.
inline bool numbers_at_most(const Json& j, double limit) {
  if (j.is_number()) return std::fabs(j.get<double>()) <= limit;
  if (j.is_structured())
    for (const auto& v : j)
      if (!numbers_at_most(v, limit)) return false;
  return true;
}

inline std::string as_string(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

}  // namespace kiln::fuzz
