// The string hashes behind Keras's Hashing layer (TensorFlow's
// tf.strings.to_hash_bucket_fast / _strong):
//
//   fingerprint64(s)        FarmHash's Fingerprint64 (farmhashna::Hash64),
//                           what to_hash_bucket_fast uses (no salt).
//   siphash24(k0, k1, s)    SipHash-2-4 with the 128-bit key (k0, k1), what
//                           to_hash_bucket_strong uses (Keras's `salt`).
//
// Both are written here from the published algorithms (no library in
// Debian provides FarmHash). Checked against reference values: TensorFlow's
// frozen Fingerprint64 values ("a".."d", "Hello", "World"), Keras's own
// Hashing test expectations (ints 0..4 and short words, with and without
// salt), and the SipHash paper's test vectors; strings longer than 16 bytes
// take code paths those references do not cover (see string_hash_test in
// kiln/layers/new_layers_test.cc).
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string_view>

namespace kiln {

uint64_t fingerprint64(std::string_view s);
uint64_t siphash24(uint64_t k0, uint64_t k1, std::string_view s);

}  // namespace kiln
