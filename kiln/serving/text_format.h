// A small reader for the protobuf text format subset TF Serving's config
// files use: `name: value`, `name { ... }` (or `name: { ... }`, `< ... >`),
// strings in "..." or '...' with C escapes, numbers, identifiers, `#`
// comments, optional `;`/`,` separators. No schema: the callers
// (model_config.cc, batching.cc) check field names and types.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::serving {

struct TextField {
  std::string name;
  int line = 0;
  bool is_message = false;
  bool quoted = false;            // scalar came from a string literal
  std::string scalar;             // when !is_message
  std::vector<TextField> fields;  // when is_message

  // Checked accessors; ValueError naming `what`, the field and the line.
  std::string as_string(const std::string& what) const;
  int64_t as_int(const std::string& what) const;
  bool as_bool(const std::string& what) const;
};

// Parses a whole document into its top-level fields. ValueError with the
// line number on a syntax error. allow_multiline_strings: a quoted string
// may hold raw line breaks (PEM blocks pasted into an SSLConfig).
std::vector<TextField> parse_text_format(const std::string& text, const std::string& what,
                                         bool allow_multiline_strings = false);

}  // namespace kiln::serving
