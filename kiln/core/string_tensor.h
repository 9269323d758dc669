// String tensors. LibTorch has no string dtype, so kiln carries a tensor of
// strings (Keras's tf.string, TF Serving's DT_STRING, KServe v2's BYTES) as
// a uint8 tensor with one more dimension than its logical shape:
//
//   logical shape S, N = prod(S) strings  ->  uint8 tensor of shape S + [4 + W]
//   each row: bytes 0..3 the string's length L (uint32, little-endian),
//             bytes 4..4+L its bytes, the rest zeros; W >= the longest L.
//
// Rows slice, index, shuffle and stack along the leading dimensions like any
// tensor (a batch of strings is rows of one width), and any byte (NUL
// included) survives. Tensors of different widths join with concat(), which
// pads. The width is not part of a model's signature: a string Input of
// shape () takes (N, 4 + W) for any W.
//
// At the graph level the dtype is kStringDType (dtype_from_string("string")),
// a marker that no real tensor has: KerasTensor::dtype of a string input,
// InputLayer's "dtype": "string", a serving signature's DT_STRING / BYTES.
// is_string_dtype() tests it; string_storage_dtype is what tensors hold.
//
//   at::Tensor t = strings::encode({"the cat", "a dog"});      // (2, 4 + 7) uint8
//   strings::decode(t)       -> {"the cat", "a dog"}
//   strings::logical_shape(t) -> {2}
//
// Stateless and thread-safe.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "kiln/core/shape.h"

namespace kiln {

// The graph-level marker for string tensors (never a real tensor's dtype).
constexpr at::ScalarType kStringDType = at::ScalarType::Bits8;
constexpr at::ScalarType string_storage_dtype = at::kByte;
inline bool is_string_dtype(at::ScalarType t) { return t == kStringDType; }

namespace strings {

constexpr int64_t kLengthBytes = 4;

// `values` as a string tensor of logical shape `shape` (default {N}); the
// width is the longest value. ValueError if prod(shape) != values.size() or
// a value is longer than 2^32 - 1 bytes.
at::Tensor encode(const std::vector<std::string>& values, const Shape& shape);
at::Tensor encode(const std::vector<std::string>& values);

// The strings in row-major order. ValueError (naming `what`) unless `t` is a
// uint8 CPU tensor of rank >= 1 whose last dimension is >= 4 and whose every
// length fits its row.
std::vector<std::string> decode(const at::Tensor& t, const std::string& what = "string tensor");

// The logical shape: t's sizes without the last dimension.
Shape logical_shape(const at::Tensor& t);

// `t` with rows padded (zeros) to width `width` (>= its own).
at::Tensor pad_to_width(const at::Tensor& t, int64_t width);

// `parts`, each padded to the widest one's width (a batch's pieces, before
// they are joined by code that joins any tensor).
std::vector<at::Tensor> pad_to_widest(const std::vector<at::Tensor>& parts);

// Joins string tensors along logical dimension `dim` (>= 0), padding each to
// the widest first.
at::Tensor concat(const std::vector<at::Tensor>& parts, int64_t dim = 0);

// Stacks equal-shape string tensors along a new leading dimension (a batch
// of examples), padding to the widest first.
at::Tensor stack(const std::vector<at::Tensor>& parts);

}  // namespace strings
}  // namespace kiln
