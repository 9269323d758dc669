// Keras's per-layer `seed` for layers that draw random numbers in training
// (SpatialDropout2D, GaussianNoise, the Random* augmentation layers).
//
//   seed null: draws come from LibTorch's default generator, which
//     kiln::set_random_seed seeds (kiln/core/random.h), so a seeded run
//     repeats, as Dropout's masks do.
//   seed an integer: the layer owns a generator seeded with it, so its draws
//     repeat whatever other layers draw (Keras's SeedGenerator(seed)).
//
//   SeedGenerator seeds(config_seed);
//   at::Tensor u = at::rand({n}, seeds.generator(), at::kFloat);
//
// Thread safety: LibTorch's CPU kernels lock a generator while they draw.
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "kiln/core/json.h"

namespace kiln {

class ConfigReader;

class SeedGenerator {
 public:
  SeedGenerator() = default;
  explicit SeedGenerator(std::optional<int64_t> seed);
  // Reads `seed` (null or an integer) from a layer's config.
  static SeedGenerator from_config(ConfigReader& r);
  // For at::rand / at::randn (c10::optional: LibTorch 1.13 takes no
  // std::optional there); nullopt means the default generator.
  c10::optional<at::Generator> generator() const;
  Json to_json() const;  // the seed, or null

 private:
  std::optional<int64_t> seed_;
  c10::optional<at::Generator> gen_;
};

}  // namespace kiln
