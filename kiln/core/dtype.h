// Keras dtype names and dtype policies.
//
// A DTypePolicy decides the dtype layers compute in and the dtype their
// variables are stored in: "float32", "mixed_float16" (compute float16,
// variables float32), "mixed_bfloat16", "float16", "bfloat16". Layers never
// pick precision themselves: they ask their policy (see Layer::compute_cast).
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "kiln/core/json.h"

namespace kiln {

// "float32" <-> at::kFloat etc. ValueError names the unknown dtype and lists
// the known ones.
at::ScalarType dtype_from_string(const std::string& name);
std::string dtype_to_string(at::ScalarType t);

// Quantized policies (Keras's QuantizedDTypePolicy) are named
// "<mode>_from_<source policy>" ("int8_from_float32",
// "float8_from_mixed_bfloat16"): the layer computes as the source policy
// says, and its quantizable kernel runs in `mode` ("int8", "float8",
// "int8_qat"). model.quantize() sets them; model.json keeps them, so a saved
// quantized model rebuilds the same kernels.
class DTypePolicy {
 public:
  DTypePolicy() : DTypePolicy("float32") {}
  explicit DTypePolicy(const std::string& name);  // ValueError if unknown

  const std::string& name() const { return name_; }
  // "" for float policies; else the quantization mode.
  const std::string& quantization_mode() const { return mode_; }
  // The policy a quantized one computes with ("float32"); name() otherwise.
  const std::string& source_name() const { return source_; }
  bool is_quantized() const { return !mode_.empty(); }
  // int8 with calibrated (static) input scales.
  bool static_inputs() const { return static_inputs_; }
  int64_t amax_history_length() const { return amax_history_length_; }
  // This policy quantized in `mode` (ValueError for an unknown mode).
  DTypePolicy quantized(const std::string& mode, bool static_inputs = false, int64_t amax_history_length = 1024) const;
  // Keras 3's serialized form: {"module", "class_name": "DTypePolicy" |
  // "QuantizedDTypePolicy" | "QuantizedFloat8DTypePolicy", "config", ...}.
  Json to_json() const;
  // A name or that serialized form; ValueError otherwise.
  static DTypePolicy from_json(const Json& j);
  at::ScalarType compute_dtype() const { return compute_; }
  at::ScalarType variable_dtype() const { return variable_; }
  bool is_mixed() const { return compute_ != variable_; }
  bool operator==(const DTypePolicy& o) const { return name_ == o.name_; }

 private:
  std::string name_, mode_, source_;
  bool static_inputs_ = false;
  int64_t amax_history_length_ = 1024;
  at::ScalarType compute_;
  at::ScalarType variable_;
};

// The global policy new layers take when none is given (Keras's
// keras.mixed_precision.set_dtype_policy).
void set_dtype_policy(const std::string& name);
DTypePolicy dtype_policy();

}  // namespace kiln
