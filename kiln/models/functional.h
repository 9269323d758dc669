// Functional: a model defined by a graph of layers, with several inputs
// and outputs, shared layers and residual connections.
//
//   auto in = Input({784});
//   auto h = (*std::make_shared<Dense>(64, "relu"))(in);
//   auto r = (*std::make_shared<Add>())({h, (*std::make_shared<Dense>(64))(in)});
//   auto out = (*std::make_shared<Dense>(10))(r);
//   auto model = std::make_shared<Functional>(KerasTensors{in}, KerasTensors{out});
//
// The config is Keras 3's (model.to_json()): layers with their inbound
// nodes ({"args": [...], "kwargs": {}} of __keras_tensor__ objects whose
// keras_history is [layer_name, node_index, tensor_index]), and the model's
// input_layers / output_layers as such triples. Keras 2's and kiln's older
// forms are read too (see kiln/models/model_json.h).
#pragma once

#include "kiln/layers/layer_holder.h"
#include "kiln/models/model.h"

namespace kiln {

namespace models {

class FunctionalImpl : public Model {
 public:
  FunctionalImpl(const KerasTensors& inputs, const KerasTensors& outputs, const std::string& name = "");
  explicit FunctionalImpl(const Json& config);  // registry form
  std::string class_name() const override { return "Functional"; }
  void build(const std::vector<Shape>&) override {}  // its layers are built as the graph is made

  std::vector<LayerPtr> layers() const override;  // topological, InputLayers first
  std::vector<Shape> input_shapes() const override;
  std::vector<at::ScalarType> input_dtypes() const override;
  std::vector<std::string> input_names() const override;
  std::vector<std::string> output_names() const override;
  std::vector<LayerPtr> sublayers() const override;

  Tensors call(const Tensors& inputs, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;
  bool supports_masking() const override { return true; }

 protected:
  // Carries masks along the graph's edges (layer.h, masking).
  Tensors call_masked(const Tensors& inputs, const Tensors& masks, bool training, Tensors* output_masks) override;

 private:
  void init(const KerasTensors& inputs, const KerasTensors& outputs);
  // ModelParallel: which column-parallel layers keep their output split
  // (every consumer, past element-wise layers, is row-parallel on the same
  // axis, and none of it is a model output). Once per distribution.
  void plan_sharded_layers();

  KerasTensors inputs_, outputs_;
  std::vector<std::shared_ptr<Node>> nodes_;  // topological order
  std::vector<LayerPtr> layers_;              // unique, topological order
  std::weak_ptr<Distribution> planned_for_;   // plan_sharded_layers ran under it
};
KILN_LAYER_HOLDER(Functional, void);

}  // namespace models

}  // namespace kiln

#define KILN_LEGACY_MODELS_FUNCTIONAL_H
#include "kiln/models/legacy_names.h"
