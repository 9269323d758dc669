// Layer: the unit every model is made of, with Keras 3's lifecycle.
//
//   constructor     stores the config (validated; errors name the value)
//   build(shapes)   creates variables through add_weight (lazily, on first call)
//   call(x, train)  computes
//   get_config()    round-trips through LayerRegistry by class name
//
// Example:
//   auto dense = std::make_shared<Dense>(64, "relu");
//   at::Tensor y = (*dense)(x);            // builds with x's shape, then calls
//   Json cfg = dense->to_json();           // {"class_name":"Dense","config":{...}}
//   auto copy = layer_from_json(cfg);      // same config, fresh weights
//
// Precision: variables are stored in the policy's variable dtype; call()
// reads them through value(v), which casts to the compute dtype, and inputs
// are cast by operator() (Keras autocasting). Placement/sharding come from
// VariableFactory. Layers never branch on either.
//
// Multiple inputs/outputs: call() takes and returns vectors; single-tensor
// layers derive from SimpleLayer and implement call1().
//
// Thread safety: build() must not race; once built, call() with
// training=false may run concurrently from several threads (the server
// relies on this) unless a layer documents otherwise.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/core/initializers.h"
#include "kiln/core/json.h"
#include "kiln/core/shape.h"
#include "kiln/core/variable.h"
#include "kiln/layers/kernel_impl.h"
#include "kiln/layers/layer_holder.h"
#include "kiln/layers/regularizers.h"

namespace kiln {

using Tensors = std::vector<at::Tensor>;
class Layer;
using LayerPtr = std::shared_ptr<Layer>;
struct Node;

// A symbolic tensor: the output of a layer applied to symbolic inputs while
// building a Functional model (Keras's KerasTensor).
struct KerasTensor {
  Shape shape;  // with kNone for the batch dimension
  at::ScalarType dtype = at::kFloat;
  std::shared_ptr<Node> node;  // the layer application that produced it
  int index = 0;               // which output of that node
  std::string name() const;
};
using KerasTensors = std::vector<KerasTensor>;

// One application of a layer in a Functional graph.
struct Node {
  LayerPtr layer;
  KerasTensors inputs;  // empty for an InputLayer's node
  std::vector<Shape> output_shapes;
  std::vector<at::ScalarType> output_dtypes;
};

class Layer : public std::enable_shared_from_this<Layer> {
 public:
  // `config` may carry the base keys: name, trainable, dtype (a policy name).
  explicit Layer(const Json& config = Json::object());
  virtual ~Layer();
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  // The registry key and Keras's class name ("Dense").
  virtual std::string class_name() const = 0;
  // Given at construction or, if none, the first time it is asked for
  // ("dense", "dense_1", ...).
  const std::string& name() const;

  // --- lifecycle ---------------------------------------------------------
  bool built() const { return built_; }
  // Creates variables for inputs of these shapes (batch dim may be kNone).
  // Default: no variables. Override, call add_weight, do not set built.
  virtual void build(const std::vector<Shape>& input_shapes) {}
  // Builds (under this layer's name scope) if not built yet.
  void build_if_needed(const std::vector<Shape>& input_shapes);
  virtual Tensors call(const Tensors& inputs, bool training) = 0;

  // Build if needed, autocast inputs to the compute dtype, call, validate.
  Tensors operator()(const Tensors& inputs, bool training = false);
  at::Tensor operator()(const at::Tensor& x, bool training = false);  // one in, one out
  // Symbolic application (Functional API): records a Node, infers shapes.
  KerasTensors operator()(const KerasTensors& inputs);
  KerasTensor operator()(const KerasTensor& x);

  // Output shapes for these input shapes. Default: builds the layer and runs
  // call() on a zero probe tensor (batch 1, no grad). Override when the probe
  // is wrong (integer inputs) or costly.
  virtual std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes);
  // Default: float inputs keep the compute dtype, others unchanged.
  virtual std::vector<at::ScalarType> compute_output_dtype(const std::vector<at::ScalarType>& in);
  // The shapes the layer was built with (empty before build).
  const std::vector<Shape>& build_input_shapes() const { return build_shapes_; }

  // --- masking (Keras's supports_masking / compute_mask / call(mask=)) ----
  // A mask marks the valid steps of a sequence: a bool tensor of the
  // input's leading dims ((batch, time) for (batch, time, features)); an
  // undefined tensor means "no mask". Embedding(mask_zero=true) and Masking
  // make masks, recurrent layers use them (masked steps keep the previous
  // state and output), Sequential and Functional carry them between their
  // layers, and the trainer applies an output's mask to the loss and the
  // mean metrics (as Keras 3). See kiln/layers/masking.h.
  //
  // true: masks pass through (the default compute_mask gives the first
  // output the first input's mask); false (default, as Keras): masks stop here.
  virtual bool supports_masking() const { return false; }
  // The outputs' masks for these inputs and input masks (one entry per
  // output, or fewer: the rest have none).
  virtual Tensors compute_mask(const Tensors& inputs, const Tensors& masks);
  // operator()(inputs, training) with masks: `masks` is empty or one per
  // input; `output_masks` (if not null) receives one per output.
  Tensors call_with_masks(const Tensors& inputs, const Tensors& masks, bool training, Tensors* output_masks);

  // --- weights -----------------------------------------------------------
  VariablePtr add_weight(const std::string& name, const Shape& shape, InitializerPtr initializer, bool trainable = true,
                         RegularizerPtr regularizer = nullptr, std::optional<at::ScalarType> dtype = std::nullopt);
  // This layer's and its sublayers' variables, in creation order, no repeats.
  std::vector<VariablePtr> weights() const;
  std::vector<VariablePtr> trainable_weights() const;
  std::vector<VariablePtr> non_trainable_weights() const;
  int64_t count_params() const;
  // Weights in order as plain tensors (detached copies) and back.
  Tensors get_weights() const;
  void set_weights(const Tensors& values);

  // Sublayers (for subclassed layers/models and wrappers). Tracked layers'
  // weights count as this layer's.
  void track(LayerPtr sublayer);
  virtual std::vector<LayerPtr> sublayers() const { return sublayers_; }

  // Keras semantics: false freezes every weight below (and puts
  // BatchNormalization in inference mode).
  bool trainable() const { return trainable_; }
  virtual void set_trainable(bool trainable);

  // Sum of weight regularization penalties (and add_loss terms from the last
  // call) of this layer and its sublayers. Zero tensor if none.
  at::Tensor regularization_loss() const;
  void add_loss(const at::Tensor& loss);  // activity losses, cleared each call
  void clear_losses();

  // --- precision ---------------------------------------------------------
  const DTypePolicy& dtype_policy() const { return policy_; }
  void set_dtype_policy(const DTypePolicy& p) { policy_ = p; }
  // A floating tensor cast to the compute dtype (others unchanged).
  at::Tensor compute_cast(const at::Tensor& x) const;
  // A variable read in the compute dtype (autocast).
  at::Tensor value(const VariablePtr& v) const { return compute_cast(v->value()); }
  // Layers that must run in float32 whatever the policy (e.g. softmax
  // outputs) override to false.
  virtual bool autocast() const { return true; }

  // --- config ------------------------------------------------------------
  // Base keys + the layer's own; every value needed to rebuild the layer.
  virtual Json get_config() const;
  // {"class_name": ..., "config": ..., "build_config": {"input_shapes": ...}}
  Json to_json() const;

  // Quantization (Keras's layer.quantize(mode)): swaps a built layer's
  // kernel implementation for `mode`'s ("int8", "float8", "int8_qat"; see
  // kernel_impl.h) and sets its policy to "<mode>_from_<policy>". Dense,
  // EinsumDense and Embedding implement it; the default throws ValueError.
  // Models quantize every quantizable layer they contain.
  virtual void quantize(const std::string& mode);
  // Whether quantize(mode) is implemented for this layer (models: for a layer inside).
  virtual bool supports_quantization(const std::string& mode) const { return false; }
  // The kernel implementation of a quantizable layer (null otherwise), for
  // calibration and export.
  virtual KernelImpl* kernel_impl_ptr() { return nullptr; }
  // Post-training static quantization (kiln/models/calibration.h): an int8
  // layer that has observed calibration inputs fixes its input scale and
  // its policy records the static scheme. Other layers do nothing.
  virtual void finish_calibration(const std::string& method, double percentile);

 protected:
  // The compute step under call_with_masks. Default: call(inputs, training),
  // and compute_mask(inputs, masks) into *output_masks when asked. Layers
  // that use masks (recurrent layers) and models (which carry masks between
  // their layers) override; their call() runs this with no masks.
  virtual Tensors call_masked(const Tensors& inputs, const Tensors& masks, bool training, Tensors* output_masks);
  // Base config keys, for subclasses that build get_config() up.
  Json base_config() const;
  void mark_built() { built_ = true; }
  // Quantizable layers: the implementation the policy names, with its own
  // weights created now (call in build(), after the float kernel; create
  // the float kernel only when policy_keeps_float_kernel()).
  KernelImplPtr build_kernel_impl(const KernelSpec& spec);
  bool policy_keeps_float_kernel() const;
  // quantize(mode) for a layer with one kernel: replaces `impl`, converts
  // `kernel` into the new implementation's weights and drops it when the
  // new implementation keeps none (int8).
  void quantize_kernel(const std::string& mode, const KernelSpec& spec, KernelImplPtr& impl, VariablePtr& kernel);
  // add_weight for kernel implementations; `scope` is the layer's full path
  // prefix when called outside build() ("" inside it).
  AddWeightFn weight_adder(const std::string& scope = "");
  // Removes one of this layer's variables (quantize() dropping a float kernel).
  void remove_weight(const VariablePtr& v);

 private:
  mutable std::string name_;
  bool trainable_ = true;
  bool built_ = false;
  DTypePolicy policy_;
  std::vector<Shape> build_shapes_;
  std::vector<VariablePtr> variables_;
  std::vector<bool> created_trainable_;  // parallel to variables_
  std::vector<std::pair<VariablePtr, RegularizerPtr>> regularized_;
  std::vector<LayerPtr> sublayers_;
  Tensors activity_losses_;
};

// A layer with one input and one output; implement call1().
class SimpleLayer : public Layer {
 public:
  using Layer::Layer;
  Tensors call(const Tensors& inputs, bool training) final;
  virtual at::Tensor call1(const at::Tensor& x, bool training) = 0;
};

// --- registry -------------------------------------------------------------
using LayerFactory = std::function<LayerPtr(const Json& config)>;

class LayerRegistry {
 public:
  // Returns true so it can initialise a static (see KILN_REGISTER_LAYER).
  static bool add(const std::string& class_name, LayerFactory factory);
  // NotFoundError "unknown layer 'Dnse'; known layers: ..." if absent.
  static LayerPtr create(const std::string& class_name, const Json& config);
  static bool contains(const std::string& class_name);
  static std::vector<std::string> names();
};

// {"class_name": "Dense", "config": {...}} -> a new layer (unbuilt, or built
// from "build_config" when present).
LayerPtr layer_from_json(const Json& j);

// Registers `Class` (which must have `explicit Class(const Json& config)`)
// under its class name. Place once in the layer's .cc file.
#define KILN_REGISTER_LAYER(Class)                                              \
  static const bool kiln_layer_registered_##Class = ::kiln::LayerRegistry::add( \
      #Class, [](const ::kiln::Json& c) -> ::kiln::LayerPtr { return std::make_shared<Class>(c); })

// Registers `Class` under the name `Name`: KILN_REGISTER_LAYER_AS(Dense, layers::DenseImpl).
#define KILN_REGISTER_LAYER_AS(Name, Class)                                    \
  static const bool kiln_layer_registered_##Name = ::kiln::LayerRegistry::add( \
      #Name, [](const ::kiln::Json& c) -> ::kiln::LayerPtr { return std::make_shared<Class>(c); })

namespace layers {

using ::kiln::KerasTensor;
using ::kiln::KerasTensors;

// Symbolic input of a Functional model (Keras's keras.Input): `shape`
// excludes the batch dimension.
KerasTensor Input(const Shape& shape, at::ScalarType dtype = at::kFloat, const std::string& name = "");

// The layer behind keras.Input.
class InputLayerImpl : public Layer {
 public:
  explicit InputLayerImpl(const Json& config);
  std::string class_name() const override { return "InputLayer"; }
  Tensors call(const Tensors& inputs, bool training) override { return inputs; }
  Json get_config() const override;
  const Shape& batch_shape() const { return batch_shape_; }
  at::ScalarType input_dtype() const { return dtype_; }

 private:
  Shape batch_shape_;
  at::ScalarType dtype_;
};
KILN_LAYER_HOLDER(InputLayer, void);

}  // namespace layers

}  // namespace kiln

#define KILN_LEGACY_LAYERS_LAYER_H
#include "kiln/layers/legacy_names.h"
