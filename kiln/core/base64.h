// Base64 (RFC 4648) decoding for the text form of bytes: TF Serving's
// {"b64": ...} JSON values.
//
//   base64_decode("aGVsbG8=") -> "hello"   (also URL-safe '-', '_' and no padding)
//
// Stateless and thread-safe.
#pragma once

#include <string>

namespace kiln {

// Strict: the standard or URL-safe alphabet, optional '=' padding, nothing
// else. ValueError "invalid base64: ..." naming the offset of a bad character.
std::string base64_decode(const std::string& in);

}  // namespace kiln
