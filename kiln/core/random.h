// Seeding. set_random_seed(s) makes CPU runs repeat exactly: it seeds
// LibTorch's default generator (weights, dropout) and kiln's own host RNG
// (shuffling, validation splits, tuner sampling).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

namespace kiln {

void set_random_seed(uint64_t seed);

// A seed drawn from kiln's host RNG (deterministic after set_random_seed).
uint64_t next_seed();

// The host RNG; not thread-safe: draw seeds from it, not samples, from threads.
std::mt19937_64& host_rng();

// One process's host and LibTorch random states to every process of a job:
// `broadcast` sends tensors from that process to the others in place (a
// Distribution's or Collectives' broadcast); `sender` is true on it. Data
// parallelism shares them so every replica shuffles alike, model
// parallelism so every rank draws the same initial values.
void share_random_state(const std::function<void(std::vector<at::Tensor>&)>& broadcast, bool sender);

}  // namespace kiln
