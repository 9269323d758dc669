#include "kiln/layers/seed_generator.h"

#include <ATen/CPUGeneratorImpl.h>

#include "kiln/layers/config_reader.h"

namespace kiln {

SeedGenerator::SeedGenerator(std::optional<int64_t> seed) : seed_(seed) {
  if (seed_) gen_ = at::make_generator<at::CPUGeneratorImpl>((uint64_t)*seed_);
}

SeedGenerator SeedGenerator::from_config(ConfigReader& r) {
  const Json* s = r.get("seed");
  if (!s) return SeedGenerator(std::nullopt);
  if (!s->is_number_integer()) r.invalid("seed", "null or an integer");
  return SeedGenerator(s->get<int64_t>());
}

c10::optional<at::Generator> SeedGenerator::generator() const { return gen_; }

Json SeedGenerator::to_json() const { return seed_ ? Json(*seed_) : Json(nullptr); }

}  // namespace kiln
