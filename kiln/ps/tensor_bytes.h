// Tensors as raw bytes for the parameter-server wire format
// (proto/kiln/ps/parameter_server.proto's Tensor): dtype name, shape, and
// the elements in row-major order in the host's byte order (little-endian
// on every platform kiln builds for). One memcpy each way.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "kiln/core/shape.h"

namespace kiln::ps {

// The elements of `t` (any device, any strides) as bytes.
std::string tensor_bytes(const at::Tensor& t);

// A CPU tensor from bytes. ValueError (naming `what`) for an unknown dtype, a
// negative dimension, or a byte count that does not match dtype and shape.
at::Tensor tensor_from_bytes(const std::string& dtype, const Shape& shape, const std::string& bytes,
                             const std::string& what);

}  // namespace kiln::ps
