#include "kiln/core/string_tensor.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "kiln/core/error.h"

namespace kiln::strings {

namespace {

int64_t product(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void check_layout(const at::Tensor& t, const std::string& what) {
  if (!t.defined() || t.scalar_type() != string_storage_dtype || t.dim() < 1 || t.size(-1) < kLengthBytes)
    throw ValueError(what + " is not a string tensor: expected uint8 of shape (..., 4 + width), received " +
                     (t.defined() ? std::string(c10::toString(t.scalar_type())) + " of shape " + sizes_str(t)
                                  : std::string("an undefined tensor")) +
                     ". Build string tensors with kiln::strings::encode().");
}

uint32_t read_length(const uint8_t* row) {
  return uint32_t(row[0]) | uint32_t(row[1]) << 8 | uint32_t(row[2]) << 16 | uint32_t(row[3]) << 24;
}

}  // namespace

at::Tensor encode(const std::vector<std::string>& values, const Shape& shape) {
  if (product(shape) != static_cast<int64_t>(values.size()))
    throw ValueError("strings::encode: " + std::to_string(values.size()) + " strings do not fill shape " +
                     shape_to_string(shape) + "; pass a shape whose product is the number of strings.");
  size_t width = 0;
  for (const auto& v : values) {
    if (v.size() > std::numeric_limits<uint32_t>::max())
      throw ValueError("strings::encode: a string of " + std::to_string(v.size()) +
                       " bytes is longer than a string tensor holds (2^32 - 1)");
    width = std::max(width, v.size());
  }
  Shape sizes = shape;
  sizes.push_back(kLengthBytes + static_cast<int64_t>(width));
  at::Tensor t = at::zeros(sizes, at::TensorOptions().dtype(string_storage_dtype));
  uint8_t* out = t.data_ptr<uint8_t>();
  const size_t stride = kLengthBytes + width;
  for (size_t i = 0; i < values.size(); ++i) {
    uint8_t* row = out + i * stride;
    const auto len = static_cast<uint32_t>(values[i].size());
    row[0] = len & 0xff;
    row[1] = (len >> 8) & 0xff;
    row[2] = (len >> 16) & 0xff;
    row[3] = (len >> 24) & 0xff;
    if (len) std::memcpy(row + kLengthBytes, values[i].data(), len);
  }
  return t;
}

at::Tensor encode(const std::vector<std::string>& values) {
  return encode(values, Shape{static_cast<int64_t>(values.size())});
}

std::vector<std::string> decode(const at::Tensor& t, const std::string& what) {
  check_layout(t, what);
  at::Tensor c = t.to(at::kCPU).contiguous();
  const int64_t stride = c.size(-1);
  const int64_t rows = stride == 0 ? 0 : c.numel() / stride;
  const uint8_t* in = c.data_ptr<uint8_t>();
  std::vector<std::string> out;
  out.reserve(rows);
  for (int64_t i = 0; i < rows; ++i) {
    const uint8_t* row = in + i * stride;
    const uint32_t len = read_length(row);
    if (static_cast<int64_t>(len) > stride - kLengthBytes)
      throw ValueError(what + ": string " + std::to_string(i) + " claims " + std::to_string(len) +
                       " bytes but its row holds " + std::to_string(stride - kLengthBytes) +
                       "; the tensor was not built by kiln::strings::encode().");
    out.emplace_back(reinterpret_cast<const char*>(row + kLengthBytes), len);
  }
  return out;
}

Shape logical_shape(const at::Tensor& t) {
  Shape s = sizes_of(t);
  if (!s.empty()) s.pop_back();
  return s;
}

at::Tensor pad_to_width(const at::Tensor& t, int64_t width) {
  check_layout(t, "strings::pad_to_width");
  const int64_t have = t.size(-1) - kLengthBytes;
  if (width < have)
    throw ValueError("strings::pad_to_width: width " + std::to_string(width) + " is below the tensor's " +
                     std::to_string(have));
  if (width == have) return t;
  return at::constant_pad_nd(t, {0, width - have}, 0);
}

std::vector<at::Tensor> pad_to_widest(const std::vector<at::Tensor>& parts) {
  int64_t width = 0;
  for (const auto& p : parts) {
    check_layout(p, "strings::pad_to_widest");
    width = std::max(width, p.size(-1) - kLengthBytes);
  }
  std::vector<at::Tensor> out;
  out.reserve(parts.size());
  for (const auto& p : parts) out.push_back(pad_to_width(p, width));
  return out;
}

at::Tensor concat(const std::vector<at::Tensor>& parts, int64_t dim) {
  if (parts.empty()) throw ValueError("strings::concat: no tensors to join");
  if (dim < 0 || dim >= parts[0].dim() - 1)
    throw ValueError("strings::concat: dim " + std::to_string(dim) + " is not a logical dimension of shape " +
                     shape_to_string(logical_shape(parts[0])));
  return at::cat(pad_to_widest(parts), dim);
}

at::Tensor stack(const std::vector<at::Tensor>& parts) {
  if (parts.empty()) throw ValueError("strings::stack: no tensors to stack");
  return at::stack(pad_to_widest(parts), 0);
}

}  // namespace kiln::strings
