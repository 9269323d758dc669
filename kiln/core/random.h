// Seeding. set_random_seed(s) makes CPU runs repeat exactly: it seeds
// LibTorch's default generator (weights, dropout) and kiln's own host RNG
// (shuffling, validation splits, tuner sampling).
#pragma once

#include <cstdint>
#include <random>

namespace kiln {

void set_random_seed(uint64_t seed);

// A seed drawn from kiln's host RNG (deterministic after set_random_seed).
uint64_t next_seed();

// The host RNG; not thread-safe: draw seeds from it, not samples, from threads.
std::mt19937_64& host_rng();

}  // namespace kiln
