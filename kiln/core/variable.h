// Variables and the factory every weight is created through.
//
// A Variable is a named, path-addressed tensor ("sequential/dense_1/kernel").
// Layers never construct tensors for their weights directly: they call
// Layer::add_weight, which asks VariableFactory, which
//   - builds the path from the active NameScope stack,
//   - takes the dtype from the layer's DTypePolicy (variable dtype),
//   - asks the active Distribution (if any) for the variable's layout and
//     device, and lets it place the initial value (replicate or shard).
// This is the seam through which distribution and precision reach every
// layer without a branch in any layer.
//
// Thread safety: a Variable's value may be read from many threads while no
// thread assigns to it; the training loop is the only writer.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/core/dtype.h"
#include "kiln/core/initializers.h"
#include "kiln/core/shape.h"

namespace kiln {

// How a variable's dimensions map onto a device mesh: one mesh-axis name per
// tensor dimension, "" meaning replicated along that dimension (Keras's
// TensorLayout). Empty `axes` means fully replicated.
struct TensorLayout {
  std::vector<std::string> axes;
  bool replicated() const;
};

class Variable {
 public:
  Variable(std::string path, at::Tensor value, bool trainable, TensorLayout layout = {});

  const std::string& path() const { return path_; }
  std::string name() const;  // last path component ("kernel")
  bool trainable() const { return trainable_; }
  void set_trainable(bool t);

  // The leaf tensor: requires_grad exactly when trainable. Use it in call();
  // gradients accumulate in value().grad().
  const at::Tensor& value() const { return value_; }
  Shape shape() const;
  at::ScalarType dtype() const { return value_.scalar_type(); }
  const TensorLayout& layout() const { return layout_; }

  // In-place copy (no autograd), keeping identity so optimizers' references
  // stay valid. ShapeError names the path and both shapes on mismatch.
  void assign(const at::Tensor& v);

 private:
  std::string path_;
  at::Tensor value_;
  bool trainable_;
  TensorLayout layout_;
};

using VariablePtr = std::shared_ptr<Variable>;

// Hook implemented by kiln/distribute (DataParallel, ModelParallel). Absent
// (nullptr) means a single device.
class Distribution {
 public:
  virtual ~Distribution() = default;
  virtual TensorLayout layout_for(const std::string& path, const Shape& shape) const = 0;
  virtual at::Device device() const { return at::kCPU; }
  // Place an initial value according to `layout` (replicate or shard).
  virtual at::Tensor distribute_variable(const at::Tensor& value, const TensorLayout& layout) const {
    return value.to(device());
  }
};

void set_distribution(std::shared_ptr<Distribution> d);
std::shared_ptr<Distribution> distribution();

// Scoped path prefix: NameScope s("sequential"); variables created inside get
// "sequential/<layer>/<name>". Thread-local; nests.
class NameScope {
 public:
  explicit NameScope(const std::string& name);
  ~NameScope();
  NameScope(const NameScope&) = delete;
  NameScope& operator=(const NameScope&) = delete;
};
std::string current_name_scope();  // "sequential/dense_1", or ""

struct VariableSpec {
  std::string name;            // "kernel"
  Shape shape;                 // fully known
  InitializerPtr initializer;  // required
  bool trainable = true;
  std::optional<at::ScalarType> dtype;  // default: the policy's variable dtype
};

class VariableFactory {
 public:
  static VariablePtr create(const VariableSpec& spec, const DTypePolicy& policy);
};

}  // namespace kiln
