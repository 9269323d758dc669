#include "kiln/core/base64.h"

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

}  // namespace kiln
