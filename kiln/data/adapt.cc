#include "kiln/data/adapt.h"

#include "kiln/core/error.h"

namespace kiln {
namespace {

// The batches a layer's streaming adapt(next_batch) pulls: component
// `component` of each element, at most `steps` (> 0) of them.
std::function<at::Tensor()> batches_of(const data::Dataset& dataset, int64_t steps, size_t component) {
  std::shared_ptr<data::DatasetIterator> it = dataset.iterator();
  auto seen = std::make_shared<int64_t>(0);
  return [it, seen, steps, component]() -> at::Tensor {
    if (steps > 0 && *seen >= steps) return at::Tensor();
    auto element = it->next();
    if (!element) return at::Tensor();
    ++*seen;
    if (component >= element->size())
      throw ValueError("adapt: dataset elements have " + std::to_string(element->size()) +
                       " components; received component=" + std::to_string(component));
    return (*element)[component];
  };
}

}  // namespace

void adapt(layers::NormalizationImpl& layer, const data::Dataset& dataset, int64_t steps, size_t component) {
  layer.adapt(batches_of(dataset, steps, component));
}

void adapt(layers::StringLookupImpl& layer, const data::Dataset& dataset, int64_t steps, size_t component) {
  layer.adapt(batches_of(dataset, steps, component));
}

void adapt(layers::TextVectorizationImpl& layer, const data::Dataset& dataset, int64_t steps, size_t component) {
  layer.adapt(batches_of(dataset, steps, component));
}

}  // namespace kiln
