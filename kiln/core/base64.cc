#include "kiln/core/base64.h"

#include <algorithm>
#include <cstdint>

#include "kiln/core/error.h"

namespace kiln {

std::string base64_decode(const std::string& in) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
  };
  size_t n = in.size();
  while (n > 0 && in[n - 1] == '=') --n;
  if (in.size() - n > 2 || (in.size() % 4 != 0 && in.size() != n)) throw ValueError("invalid base64: bad padding");
  if (n % 4 == 1) throw ValueError("invalid base64: truncated input");
  std::string out;
  out.reserve(n * 3 / 4);
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < n; ++i) {
    int v = val(in[i]);
    if (v < 0) throw ValueError("invalid base64: unexpected character at offset " + std::to_string(i));
    acc = (acc << 6) | (uint32_t)v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back((char)((acc >> bits) & 0xFF));
    }
  }
  return out;
}

std::string base64_encode(const std::string& in) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  for (size_t i = 0; i < in.size(); i += 3) {
    const size_t n = std::min<size_t>(3, in.size() - i);
    uint32_t v = 0;
    for (size_t k = 0; k < 3; ++k) v = (v << 8) | (k < n ? (uint8_t)in[i + k] : 0u);
    for (size_t k = 0; k < 4; ++k) out.push_back(k <= n ? kAlphabet[(v >> (18 - 6 * k)) & 63] : '=');
  }
  return out;
}

}  // namespace kiln
