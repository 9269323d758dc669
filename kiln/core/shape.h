// Shapes with an unknown batch dimension, as Keras prints them: (None, 28, 28).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace at {
class Tensor;
}

namespace kiln {

// -1 stands for "None" (unknown, usually the batch dimension).
using Shape = std::vector<int64_t>;
constexpr int64_t kNone = -1;

std::string shape_to_string(const Shape& s);  // "(None, 28, 28)"
int64_t num_elements(const Shape& s);         // product; -1 if any dim unknown
// Replace unknown dims by `fill` (used to run a layer on a probe tensor).
Shape concrete(const Shape& s, int64_t fill = 1);

// A tensor's sizes as a Shape, and as text: "(32, 10)".
Shape sizes_of(const at::Tensor& t);
std::string sizes_str(const at::Tensor& t);

}  // namespace kiln
