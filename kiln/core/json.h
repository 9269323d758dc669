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

// Required key; ValueError "`<owner>` config is missing `<key>`" otherwise.
const Json& require(const Json& j, const char* key, const std::string& owner);

}  // namespace kiln

#include "kiln/core/json_inl.h"
