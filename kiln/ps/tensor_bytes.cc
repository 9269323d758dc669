#include "kiln/ps/tensor_bytes.h"

#include <cstring>

#include "kiln/core/dtype.h"
#include "kiln/core/error.h"

namespace kiln::ps {

std::string tensor_bytes(const at::Tensor& t) {
  const at::Tensor c = t.detach().to(at::kCPU).contiguous();
  std::string out(c.numel() * c.element_size(), '\0');
  if (!out.empty()) std::memcpy(out.data(), c.data_ptr(), out.size());
  return out;
}

at::Tensor tensor_from_bytes(const std::string& dtype, const Shape& shape, const std::string& bytes,
                             const std::string& what) {
  at::ScalarType st;
  try {
    st = dtype_from_string(dtype);
  } catch (const ValueError& e) {
    throw ValueError(what + ": " + e.what());
  }
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw ValueError(what + ": shape " + shape_to_string(shape) + " has a negative dimension");
    n *= d;
  }
  const size_t expected = static_cast<size_t>(n) * c10::elementSize(st);
  if (bytes.size() != expected)
    throw ValueError(what + ": a " + dtype + " tensor of shape " + shape_to_string(shape) + " takes " +
                     std::to_string(expected) + " bytes. Received: " + std::to_string(bytes.size()) + " bytes");
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(st));
  if (expected) std::memcpy(t.data_ptr(), bytes.data(), expected);
  return t;
}

}  // namespace kiln::ps
