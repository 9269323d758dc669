// Keras dtype names and dtype policies.
//
// A DTypePolicy decides the dtype layers compute in and the dtype their
// variables are stored in: "float32", "mixed_float16" (compute float16,
// variables float32), "mixed_bfloat16", "float16", "bfloat16". Layers never
// pick precision themselves: they ask their policy (see Layer::compute_cast).
#pragma once

#include <ATen/ATen.h>

#include <string>

namespace kiln {

// "float32" <-> at::kFloat etc. ValueError names the unknown dtype and lists
// the known ones.
at::ScalarType dtype_from_string(const std::string& name);
std::string dtype_to_string(at::ScalarType t);

class DTypePolicy {
 public:
  DTypePolicy() : DTypePolicy("float32") {}
  explicit DTypePolicy(const std::string& name);  // ValueError if unknown

  const std::string& name() const { return name_; }
  at::ScalarType compute_dtype() const { return compute_; }
  at::ScalarType variable_dtype() const { return variable_; }
  bool is_mixed() const { return compute_ != variable_; }
  bool operator==(const DTypePolicy& o) const { return name_ == o.name_; }

 private:
  std::string name_;
  at::ScalarType compute_;
  at::ScalarType variable_;
};

// The global policy new layers take when none is given (Keras's
// keras.mixed_precision.set_dtype_policy).
void set_dtype_policy(const std::string& name);
DTypePolicy dtype_policy();

}  // namespace kiln
