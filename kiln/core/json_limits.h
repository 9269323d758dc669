// Limits on JSON that comes from outside (files, request bodies, command-line
// arguments) and the one way to quote a value in an error message.
//
// Depth. kiln's JSON code (copies, dumps, tensor codecs) recurses once per
// level of nesting, so a line of 50,000 '[' would overflow the stack. Every
// reader of untrusted text checks the depth first, without recursion:
//   check_json_depth(text, path);   // FormatError past kMaxJsonDepth levels
// parse_json() and read_json_file() (kiln/core/json.h) do this themselves;
// the server uses json_depth() with its --max_json_depth (default the same).
//
// Quoting. An error names the bad value, but a value may be a megabyte (or
// deeply nested): quote at most a short prefix.
//   throw ValueError("`units` must be an integer. Received: " + json_excerpt(v));
//   throw FormatError(where + ": cannot parse " + text_excerpt(field));
//
// All functions are thread-safe and never recurse deeper than max_chars.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "kiln/core/json.h"

namespace kiln {

// The deepest nesting of arrays and objects kiln accepts in JSON it reads:
// model.json, specs, data and instance lines, tune specs, server configs and
// REST request bodies. Real documents stay far below it (a Keras 3 Functional
// model.json nests about 12 levels, plus 3 per nested model).
inline constexpr int kMaxJsonDepth = 64;

// Deepest nesting of arrays/objects in `text` (strings skipped), scanning
// without recursion; stops early and returns a value > limit once `limit`
// is exceeded.
int json_depth(std::string_view text, int limit = kMaxJsonDepth);

// FormatError "<what> nests JSON lists and objects more than <limit> levels
// deep ..." when json_depth(text) > limit.
void check_json_depth(std::string_view text, const std::string& what, int limit = kMaxJsonDepth);

// Compact JSON text of `v`, cut after about max_chars characters with "..."
// appended: `[[[[[...`, `{"units":8,"act...`.
std::string json_excerpt(const Json& v, size_t max_chars = 80);

// nlohmann's exception text without its "[json.exception.type_error.302] "
// prefix: "type must be string, but is object".
std::string json_error_text(const std::exception& e);

// 'text' in single quotes, cut after max_chars characters with "..." (at a
// UTF-8 character boundary).
std::string text_excerpt(std::string_view text, size_t max_chars = 60);

}  // namespace kiln
