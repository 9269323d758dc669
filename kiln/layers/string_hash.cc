#include "kiln/layers/string_hash.h"

#include <cstring>
#include <utility>

namespace kiln {
namespace {

constexpr uint64_t sh_kK0 = 0xc3a5c85c97cb3127ULL;
constexpr uint64_t sh_kK1 = 0xb492b66fbe98f273ULL;
constexpr uint64_t sh_kK2 = 0x9ae16a3b2f90404fULL;

// Little-endian loads (the algorithms are defined on little-endian words).
uint64_t sh_load64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | (uint8_t)p[i];
  return v;
}
uint32_t sh_load32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | (uint8_t)p[i];
  return v;
}
uint64_t sh_rotr(uint64_t v, int s) { return s == 0 ? v : (v >> s) | (v << (64 - s)); }
uint64_t sh_rotl(uint64_t v, int s) { return (v << s) | (v >> (64 - s)); }
uint64_t sh_shift_mix(uint64_t v) { return v ^ (v >> 47); }

uint64_t sh_hash_len16(uint64_t u, uint64_t v, uint64_t mul) {
  uint64_t a = (u ^ v) * mul;
  a ^= a >> 47;
  uint64_t b = (v ^ a) * mul;
  b ^= b >> 47;
  return b * mul;
}

uint64_t sh_hash_len0to16(const char* s, size_t len) {
  if (len >= 8) {
    const uint64_t mul = sh_kK2 + len * 2;
    const uint64_t a = sh_load64(s) + sh_kK2;
    const uint64_t b = sh_load64(s + len - 8);
    const uint64_t c = sh_rotr(b, 37) * mul + a;
    const uint64_t d = (sh_rotr(a, 25) + b) * mul;
    return sh_hash_len16(c, d, mul);
  }
  if (len >= 4) {
    const uint64_t mul = sh_kK2 + len * 2;
    const uint64_t a = sh_load32(s);
    return sh_hash_len16(len + (a << 3), sh_load32(s + len - 4), mul);
  }
  if (len > 0) {
    const uint8_t a = (uint8_t)s[0], b = (uint8_t)s[len >> 1], c = (uint8_t)s[len - 1];
    const uint32_t y = (uint32_t)a + ((uint32_t)b << 8);
    const uint32_t z = (uint32_t)len + ((uint32_t)c << 2);
    return sh_shift_mix(y * sh_kK2 ^ z * sh_kK0) * sh_kK2;
  }
  return sh_kK2;
}

uint64_t sh_hash_len17to32(const char* s, size_t len) {
  const uint64_t mul = sh_kK2 + len * 2;
  const uint64_t a = sh_load64(s) * sh_kK1;
  const uint64_t b = sh_load64(s + 8);
  const uint64_t c = sh_load64(s + len - 8) * mul;
  const uint64_t d = sh_load64(s + len - 16) * sh_kK2;
  return sh_hash_len16(sh_rotr(a + b, 43) + sh_rotr(c, 30) + d, a + sh_rotr(b + sh_kK2, 18) + c, mul);
}

uint64_t sh_hash_len33to64(const char* s, size_t len) {
  const uint64_t mul = sh_kK2 + len * 2;
  const uint64_t a = sh_load64(s) * sh_kK2;
  const uint64_t b = sh_load64(s + 8);
  const uint64_t c = sh_load64(s + len - 8) * mul;
  const uint64_t d = sh_load64(s + len - 16) * sh_kK2;
  const uint64_t y = sh_rotr(a + b, 43) + sh_rotr(c, 30) + d;
  const uint64_t z = sh_hash_len16(y, a + sh_rotr(b + sh_kK2, 18) + c, mul);
  const uint64_t e = sh_load64(s + 16) * mul;
  const uint64_t f = sh_load64(s + 24);
  const uint64_t g = (y + sh_load64(s + len - 32)) * mul;
  const uint64_t h = (z + sh_load64(s + len - 24)) * mul;
  return sh_hash_len16(sh_rotr(e + f, 43) + sh_rotr(g, 30) + h, e + sh_rotr(f + a, 18) + g, mul);
}

std::pair<uint64_t, uint64_t> sh_weak_hash32(uint64_t w, uint64_t x, uint64_t y, uint64_t z, uint64_t a, uint64_t b) {
  a += w;
  b = sh_rotr(b + a + z, 21);
  const uint64_t c = a;
  a += x;
  a += y;
  b += sh_rotr(a, 44);
  return {a + z, b + c};
}

std::pair<uint64_t, uint64_t> sh_weak_hash32(const char* s, uint64_t a, uint64_t b) {
  return sh_weak_hash32(sh_load64(s), sh_load64(s + 8), sh_load64(s + 16), sh_load64(s + 24), a, b);
}

void sh_sip_round(uint64_t& v0, uint64_t& v1, uint64_t& v2, uint64_t& v3) {
  v0 += v1;
  v1 = sh_rotl(v1, 13);
  v1 ^= v0;
  v0 = sh_rotl(v0, 32);
  v2 += v3;
  v3 = sh_rotl(v3, 16);
  v3 ^= v2;
  v0 += v3;
  v3 = sh_rotl(v3, 21);
  v3 ^= v0;
  v2 += v1;
  v1 = sh_rotl(v1, 17);
  v1 ^= v2;
  v2 = sh_rotl(v2, 32);
}

}  // namespace

uint64_t fingerprint64(std::string_view str) {
  const char* s = str.data();
  const size_t len = str.size();
  if (len <= 16) return sh_hash_len0to16(s, len);
  if (len <= 32) return sh_hash_len17to32(s, len);
  if (len <= 64) return sh_hash_len33to64(s, len);
  // Over 64 bytes: 64-byte blocks, then the last 64 bytes.
  const uint64_t seed = 81;
  uint64_t x = seed;
  uint64_t y = seed * sh_kK1 + 113;
  uint64_t z = sh_shift_mix(y * sh_kK2 + 113) * sh_kK2;
  std::pair<uint64_t, uint64_t> v{0, 0}, w{0, 0};
  x = x * sh_kK2 + sh_load64(s);
  const char* end = s + ((len - 1) / 64) * 64;
  const char* last64 = end + ((len - 1) & 63) - 63;
  do {
    x = sh_rotr(x + y + v.first + sh_load64(s + 8), 37) * sh_kK1;
    y = sh_rotr(y + v.second + sh_load64(s + 48), 42) * sh_kK1;
    x ^= w.second;
    y += v.first + sh_load64(s + 40);
    z = sh_rotr(z + w.first, 33) * sh_kK1;
    v = sh_weak_hash32(s, v.second * sh_kK1, x + w.first);
    w = sh_weak_hash32(s + 32, z + w.second, y + sh_load64(s + 16));
    std::swap(z, x);
    s += 64;
  } while (s != end);
  const uint64_t mul = sh_kK1 + ((z & 0xff) << 1);
  s = last64;
  w.first += ((len - 1) & 63);
  v.first += w.first;
  w.first += v.first;
  x = sh_rotr(x + y + v.first + sh_load64(s + 8), 37) * mul;
  y = sh_rotr(y + v.second + sh_load64(s + 48), 42) * mul;
  x ^= w.second * 9;
  y += v.first * 9 + sh_load64(s + 40);
  z = sh_rotr(z + w.first, 33) * mul;
  v = sh_weak_hash32(s, v.second * mul, x + w.first);
  w = sh_weak_hash32(s + 32, z + w.second, y + sh_load64(s + 16));
  std::swap(z, x);
  return sh_hash_len16(sh_hash_len16(v.first, w.first, mul) + sh_shift_mix(y) * sh_kK0 + z,
                       sh_hash_len16(v.second, w.second, mul) + x, mul);
}

uint64_t siphash24(uint64_t k0, uint64_t k1, std::string_view str) {
  uint64_t v0 = k0 ^ 0x736f6d6570736575ULL;
  uint64_t v1 = k1 ^ 0x646f72616e646f6dULL;
  uint64_t v2 = k0 ^ 0x6c7967656e657261ULL;
  uint64_t v3 = k1 ^ 0x7465646279746573ULL;
  const size_t len = str.size();
  const size_t full = len / 8 * 8;
  for (size_t i = 0; i < full; i += 8) {
    const uint64_t m = sh_load64(str.data() + i);
    v3 ^= m;
    sh_sip_round(v0, v1, v2, v3);
    sh_sip_round(v0, v1, v2, v3);
    v0 ^= m;
  }
  uint64_t b = (uint64_t)(len & 0xff) << 56;
  for (size_t i = full; i < len; ++i) b |= (uint64_t)(uint8_t)str[i] << (8 * (i - full));
  v3 ^= b;
  sh_sip_round(v0, v1, v2, v3);
  sh_sip_round(v0, v1, v2, v3);
  v0 ^= b;
  v2 ^= 0xff;
  for (int i = 0; i < 4; ++i) sh_sip_round(v0, v1, v2, v3);
  return v0 ^ v1 ^ v2 ^ v3;
}

}  // namespace kiln
