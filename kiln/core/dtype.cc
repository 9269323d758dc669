#include "kiln/core/dtype.h"

#include <mutex>

#include "kiln/core/error.h"

namespace kiln {

at::ScalarType dtype_from_string(const std::string& n) {
  if (n == "float32") return at::kFloat;
  if (n == "float64") return at::kDouble;
  if (n == "float16") return at::kHalf;
  if (n == "bfloat16") return at::kBFloat16;
  if (n == "int8") return at::kChar;
  if (n == "uint8") return at::kByte;
  if (n == "int16") return at::kShort;
  if (n == "int32") return at::kInt;
  if (n == "int64") return at::kLong;
  if (n == "bool") return at::kBool;
  throw ValueError("unknown dtype '" + n +
                   "'; expected one of float32, float64, float16, bfloat16, int8, uint8, "
                   "int16, int32, int64, bool");
}

std::string dtype_to_string(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "float32";
    case at::kDouble:
      return "float64";
    case at::kHalf:
      return "float16";
    case at::kBFloat16:
      return "bfloat16";
    case at::kChar:
      return "int8";
    case at::kByte:
      return "uint8";
    case at::kShort:
      return "int16";
    case at::kInt:
      return "int32";
    case at::kLong:
      return "int64";
    case at::kBool:
      return "bool";
    default:
      return std::string(c10::toString(t));
  }
}

DTypePolicy::DTypePolicy(const std::string& name) : name_(name) {
  if (name == "mixed_float16") {
    compute_ = at::kHalf;
    variable_ = at::kFloat;
  } else if (name == "mixed_bfloat16") {
    compute_ = at::kBFloat16;
    variable_ = at::kFloat;
  } else if (name == "float32" || name == "float64" || name == "float16" || name == "bfloat16") {
    compute_ = variable_ = dtype_from_string(name);
  } else {
    throw ValueError("unknown dtype policy '" + name +
                     "'; expected float32, mixed_float16, mixed_bfloat16, float16, bfloat16 "
                     "or float64");
  }
}

namespace {
std::mutex g_policy_mu;
DTypePolicy& global_policy() {  // guarded by g_policy_mu
  static DTypePolicy p("float32");
  return p;
}
}  // namespace

void set_dtype_policy(const std::string& name) {
  DTypePolicy p(name);
  std::lock_guard<std::mutex> l(g_policy_mu);
  global_policy() = p;
}

DTypePolicy dtype_policy() {
  std::lock_guard<std::mutex> l(g_policy_mu);
  return global_policy();
}

}  // namespace kiln
