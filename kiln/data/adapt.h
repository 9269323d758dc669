// Keras's `layer.adapt(dataset)` for preprocessing layers that learn
// statistics: streams a Dataset's batches into the layer's accumulator
// without materializing the whole dataset.
//
//   auto norm = std::make_shared<Normalization>();
//   adapt(*norm, Dataset::from_tensor_slices({x}).batch(1024));
//   auto tv = layers::TextVectorization(Json{{"max_tokens", 5000}});
//   adapt(*tv, Dataset::from_tensor_slices({strings::encode(texts), labels}).batch(256));
//
// Uses element component `component` (default 0, the features of an
// (x, y) dataset); `steps` > 0 stops after that many batches. The dataset
// must be batched (each element is a batch, as in Keras's adapt). The
// string layers take string tensors (kiln/core/string_tensor.h).
#pragma once

#include "kiln/data/dataset.h"
#include "kiln/layers/preprocessing.h"
#include "kiln/layers/text_preprocessing.h"

namespace kiln {

void adapt(layers::NormalizationImpl& layer, const data::Dataset& dataset, int64_t steps = 0, size_t component = 0);
void adapt(layers::StringLookupImpl& layer, const data::Dataset& dataset, int64_t steps = 0, size_t component = 0);
void adapt(layers::TextVectorizationImpl& layer, const data::Dataset& dataset, int64_t steps = 0, size_t component = 0);

}  // namespace kiln
