// Base64 (RFC 4648) for the text form of bytes: TF Serving's {"b64": ...}
// JSON values, the RNG state in a checkpoint's training_state.json.
//
//   base64_encode("hello")    -> "aGVsbG8="  (standard alphabet, padded)
//   base64_decode("aGVsbG8=") -> "hello"   (also URL-safe '-', '_' and no padding)
//
// Stateless and thread-safe.
#pragma once

#include <string>

namespace kiln {

// Strict: the standard or URL-safe alphabet, optional '=' padding, nothing
// else. ValueError "invalid base64: ..." naming the offset of a bad character.
std::string base64_decode(const std::string& in);

std::string base64_encode(const std::string& in);

}  // namespace kiln
