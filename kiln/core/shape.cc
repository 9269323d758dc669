#include "kiln/core/shape.h"

#include <ATen/ATen.h>

namespace kiln {

std::string shape_to_string(const Shape& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += s[i] < 0 ? "None" : std::to_string(s[i]);
  }
  if (s.size() == 1) out += ",";
  return out + ")";
}

int64_t num_elements(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) {
    if (d < 0) return -1;
    n *= d;
  }
  return n;
}

Shape concrete(const Shape& s, int64_t fill) {
  Shape out = s;
  for (auto& d : out)
    if (d < 0) d = fill;
  return out;
}

Shape sizes_of(const at::Tensor& t) { return Shape(t.sizes().begin(), t.sizes().end()); }

std::string sizes_str(const at::Tensor& t) { return shape_to_string(sizes_of(t)); }

}  // namespace kiln
