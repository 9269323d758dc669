#include "kiln/data/adapt.h"

#include "kiln/core/error.h"

namespace kiln {

void adapt(layers::NormalizationImpl& layer, const Dataset& dataset, int64_t steps, size_t component) {
  auto it = dataset.iterator();
  int64_t seen = 0;
  layer.adapt([&]() -> at::Tensor {
    if (steps > 0 && seen >= steps) return at::Tensor();
    auto element = it->next();
    if (!element) return at::Tensor();
    ++seen;
    if (component >= element->size())
      throw ValueError("adapt: dataset elements have " + std::to_string(element->size()) +
                       " components; received component=" + std::to_string(component));
    return (*element)[component];
  });
}

}  // namespace kiln
