// JSON Lines instances, as `kiln predict`, `kiln predict --grpc` and
// `kiln batch-predict` read them. Each non-blank line is one instance:
//   [0.1, 0.2, ...]                       a nested list (one-input models)
//   {"inputs": [0.1, ...]}                the same, TF Serving-style
//   {"inputs": {"a": [...], "b": [...]}}  named inputs
//   {"a": [...], "b": [...]}              named inputs, per the signature
// An input of dtype "string" takes a JSON string (nested lists of them for
// a non-scalar shape; {"b64": "..."} for bytes), as TF Serving's row form:
//   "some text"                           one string input
//   {"text": "some text"}                 named
// A number for a string input, or a string for a numeric one, is a
// ValueError naming the input and both dtypes.
//
//   auto inputs = instance_inputs(*model);
//   Instance x = parse_instance(line, inputs);   // UserError naming the problem
//   Tensors batch = stack_instances({&x, &y}, inputs);
//
// Errors carry no location; callers prefix the file and line. Stateless and
// thread-safe.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "kiln/core/shape.h"

namespace kiln {
namespace models {
class Model;
}
using Tensors = std::vector<at::Tensor>;
}  // namespace kiln

namespace kiln::batch {

// One input of the model's signature.
struct InstanceInput {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  Shape shape;  // without the batch dimension; kNone where any size goes
};

// One input of one instance: values in row-major order and their shape.
struct InstanceValue {
  std::vector<double> data;          // numeric inputs
  std::vector<std::string> strings;  // string inputs
  Shape shape;
};
using Instance = std::vector<InstanceValue>;  // in the order of the inputs

// The model's inputs (names, dtypes, shapes without the batch dimension).
std::vector<InstanceInput> instance_inputs(const models::Model& model);

// Parses one line against `inputs`. ValueError (bad JSON, unknown or missing
// input, ragged list, non-number) or ShapeError (a shape the input does not
// take, naming both shapes).
Instance parse_instance(const std::string& line, const std::vector<InstanceInput>& inputs);

// True when the two instances can share a batch (same shape per input).
bool same_shapes(const Instance& a, const Instance& b);

// One tensor per input, the instances stacked along a new dim 0, in each
// input's dtype (a string tensor for a string input, kiln/core/string_tensor.h).
// Precondition: non-empty, all same_shapes.
Tensors stack_instances(const std::vector<const Instance*>& batch, const std::vector<InstanceInput>& inputs);

}  // namespace kiln::batch
