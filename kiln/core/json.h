// JSON for configs and files. Insertion-ordered so model.json and specs read
// in the order they were written (Keras writes config keys in a fixed order).
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace kiln {

using Json = nlohmann::ordered_json;

// Parses `text`; on failure throws FormatError naming `what` (a file name or
// "request body") and the parser's position.
Json parse_json(const std::string& text, const std::string& what);

// Reads and parses a JSON file; NotFoundError if it is missing.
Json read_json_file(const std::string& path);

// Typed lookup with a default and an error that names the key and the type
// expected: get_or<int>(cfg, "units", 0, "Dense").
template <class T>
T get_or(const Json& j, const char* key, const T& fallback);

// The integer `v` holds, from lo to hi: an integer, or a float with no
// fraction (64.0). Otherwise ValueError "<name> must be an integer", "<name>
// must be a whole number" or "<name> is out of range: it must be an integer
// from <lo> to <hi>", each followed by `received`. Never converts a double
// outside int64_t's range (1e308 became -2^63 that way).
int64_t json_integer(const Json& v, int64_t lo, int64_t hi, const std::string& name, const std::string& received);

// Required key; ValueError "`<owner>` config is missing `<key>`" otherwise.
const Json& require(const Json& j, const char* key, const std::string& owner);

}  // namespace kiln

#include "kiln/core/json_inl.h"
