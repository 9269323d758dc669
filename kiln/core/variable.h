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

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/core/device.h"
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
  // `global_shape`: the unsharded shape when `value` is this rank's shard of
  // a variable sharded by ModelParallel (default: value's shape).
  Variable(std::string path, at::Tensor value, bool trainable, TensorLayout layout = {},
           std::optional<Shape> global_shape = std::nullopt);

  const std::string& path() const { return path_; }
  std::string name() const;  // last path component ("kernel")
  bool trainable() const { return trainable_; }
  void set_trainable(bool t);

  // The leaf tensor: requires_grad exactly when trainable. Use it in call();
  // gradients accumulate in value().grad().
  const at::Tensor& value() const { return value_; }
  Shape shape() const;  // this rank's shape (a shard's under ModelParallel)
  // The unsharded shape (equal to shape() unless the variable is sharded).
  const Shape& global_shape() const { return global_shape_; }
  bool sharded() const { return global_shape_ != shape(); }
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
  Shape global_shape_;
};

using VariablePtr = std::shared_ptr<Variable>;

// Hook implemented by kiln/distribute (DataParallel, ModelParallel). Absent
// (nullptr) means a single device.
//
// Data-parallel replicas (one process each) are part of the hook: fit(),
// evaluate(), the metrics and the synchronized BatchNormalization reach the
// other replicas only through the collectives below, so the layers and the
// training loop never see c10d. Collectives are called by every replica in
// the same order (they block until all have called).
class Distribution {
 public:
  virtual ~Distribution() = default;
  virtual TensorLayout layout_for(const std::string& path, const Shape& shape) const = 0;
  // Where this process's variables live (default: default_device()).
  virtual at::Device device() const { return default_device(); }
  // Place an initial value according to `layout` (replicate or shard).
  virtual at::Tensor distribute_variable(const at::Tensor& value, const TensorLayout& layout) const {
    return value.to(device());
  }

  // How many replicas train together, and which one this process is (the
  // chief is replica 0: it alone writes files and prints progress).
  virtual int num_replicas() const { return 1; }
  virtual int replica_id() const { return 0; }
  // Element-wise sum across replicas, in place (identity for one replica).
  virtual void all_reduce_sum(std::vector<at::Tensor>& tensors) const {}
  // The same, started now; the returned function waits for it to finish.
  virtual std::function<void()> all_reduce_sum_async(std::vector<at::Tensor>& tensors) const {
    all_reduce_sum(tensors);
    return [] {};
  }
  // Replica `root`'s values into every replica's tensors, in place.
  virtual void broadcast(std::vector<at::Tensor>& tensors, int root = 0) const {}
  // This process's index among all processes of the job (the chief is 0:
  // it alone prints and writes files). Under DataParallel it is the
  // replica id; under ModelParallel the ranks that hold the shards of one
  // replica share a replica id but not a process index.
  virtual int process_index() const { return replica_id(); }

  // --- Model parallelism (ModelParallel): variables sharded over the axes of
  // a device mesh. The layers reach the other shards only through these.
  // The number of ranks along mesh axis `axis` (1 without a mesh) and this
  // rank's coordinate on it.
  virtual int64_t mesh_axis_size(const std::string& axis) const { return 1; }
  virtual int64_t mesh_axis_index(const std::string& axis) const { return 0; }
  // Element-wise sum, in place, over the ranks that differ from this one only
  // along `axis`.
  virtual void axis_all_reduce_sum(at::Tensor& t, const std::string& axis) const {}
  // The shards held along `axis`, concatenated along `dim` in coordinate order.
  virtual at::Tensor axis_all_gather(const at::Tensor& t, int64_t dim, const std::string& axis) const { return t; }
  // The layout asked for a layer's output (the layout map's
  // "<layer path>/output" key), if any.
  virtual std::optional<TensorLayout> output_layout(const std::string& layer_path) const { return std::nullopt; }
  // A sharded variable's whole value, gathered from its shards (a collective:
  // every process calls it for the same variables in the same order). An
  // unsharded variable's value itself (not a copy).
  virtual at::Tensor gather_variable(const Variable& v) const { return v.value().detach(); }
  // The [begin, end) ranges of the whole variable this process holds, per
  // dimension (the whole of each dimension unless the variable is sharded).
  virtual std::vector<std::pair<int64_t, int64_t>> variable_ranges(const Variable& v) const;
  // Waits until every process of the job has called it.
  virtual void barrier() const {}
  // Element-wise sum across replicas into replica `root`'s tensors, started
  // now; the returned function waits. Only `root`'s result is defined
  // afterwards (the default, an all-reduce, leaves it on every replica).
  virtual std::function<void()> reduce_sum_async(std::vector<at::Tensor>& tensors, int root) const {
    return all_reduce_sum_async(tensors);
  }

  // How fit() synchronizes gradients (DataParallel's options).
  struct GradientSync {
    int64_t bucket_bytes = 25 << 20;  // all-reduce buckets (PyTorch DDP's 25 MB)
    bool compress_bf16 = false;       // all-reduce gradients as bfloat16
    // Sharded optimizer state (ZeRO): 0 off; 1 each replica updates (and
    // holds the optimizer slots of) only the variables it owns, then the
    // owners send the new values to all; 2 as 1, and each gradient is
    // reduced to its owner only.
    int zero_stage = 0;
  };
  virtual GradientSync gradient_sync() const { return {}; }
  // How fit()/evaluate() shard the input across replicas: true (Keras's
  // auto-shard): every replica reads the same global batches and keeps its
  // share of each; false: the input is already per replica (for example
  // ds.shard(num_replicas(), replica_id())) and is used as it comes.
  virtual bool split_batches() const { return true; }
};

void set_distribution(std::shared_ptr<Distribution> d);
std::shared_ptr<Distribution> distribution();

// The active distribution's replica count (1 without one) and this
// process's replica id (0 without one); is_chief(): process 0 (the one
// process that prints and writes files).
int num_replicas();
int replica_id();
int process_index();
inline bool is_chief() { return process_index() == 0; }

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
