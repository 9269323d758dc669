// Internal to kiln/ps: tensors to and from the generated TensorBytes message,
// and the small helpers the ps tasks, their clients and the chief share.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <random>
#include <sstream>
#include <string>

#include "kiln/core/dtype.h"
#include "kiln/ps/parameter_server.grpc.pb.h"
#include "kiln/ps/tensor_bytes.h"

namespace kiln::ps {

// A random non-zero 64-bit id (incarnations, first request ids): a process
// that restarts never reuses its previous life's.
inline uint64_t random_id() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32 | rd()) | 1;
}

// Seconds as people write them: 0.5, 30.
inline std::string seconds_text(double s) {
  std::ostringstream o;
  o << s;
  return o.str();
}

}  // namespace kiln::ps

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
