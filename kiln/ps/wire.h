// Internal to kiln/ps: tensors to and from the generated TensorBytes message.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "kiln/core/dtype.h"
#include "kiln/ps/parameter_server.grpc.pb.h"
#include "kiln/ps/tensor_bytes.h"

namespace kiln::ps::wire {

inline void fill(TensorBytes* out, const at::Tensor& t) {
  out->set_dtype(dtype_to_string(t.scalar_type()));
  for (int64_t d : t.sizes()) out->add_shape(d);
  out->set_data(tensor_bytes(t));
}

inline Shape shape_of(const TensorBytes& t) { return Shape(t.shape().begin(), t.shape().end()); }

// ValueError naming `what` for a malformed message.
inline at::Tensor tensor_of(const TensorBytes& t, const std::string& what) {
  return tensor_from_bytes(t.dtype(), shape_of(t), t.data(), what);
}

}  // namespace kiln::ps::wire
