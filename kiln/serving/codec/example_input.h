// tf.Example inputs of TF Serving's Classify and Regress RPCs -> one batched
// tensor per model input.
//
// Each Example holds one instance: the feature named like a model input
// carries that input's values (float_list or int64_list; bytes_list only
// for string inputs), row-major, exactly as many as the input's shape
// (without the batch dimension) holds. ExampleListWithContext's context
// features are added to every example (an example's own feature wins).
// Errors are ValueError (INVALID_ARGUMENT) naming the example index and the
// feature. Thread safety: pure function.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "kiln/core/shape.h"
#include "tensorflow_serving/apis/input.pb.h"

namespace kiln::serving {

struct ExampleInputSpec {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  Shape shape;  // without the batch dimension; must be fully known
};

// One tensor per spec, each with the examples as its batch dimension.
std::vector<at::Tensor> examples_to_tensors(const tensorflow::serving::Input& input,
                                            const std::vector<ExampleInputSpec>& specs);

}  // namespace kiln::serving
