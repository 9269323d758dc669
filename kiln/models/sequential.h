// Sequential: a plain stack of layers, each with one input and one output.
//
//   auto model = std::make_shared<Sequential>();
//   model->add(Input({784}));                 // optional: builds at once
//   model->add(std::make_shared<Dense>(256, "relu"));
//   model->add(std::make_shared<Dense>(10));
//
// Without an Input, the model builds on its first call (or fit()).
#pragma once

#include "kiln/layers/layer_holder.h"
#include "kiln/models/model.h"

namespace kiln {

namespace models {

// One entry of Sequential's initializer list, as in Keras's
// Sequential([keras.Input((784,)), Dense(256), ...]): an Input or a layer.
class SequentialItem {
 public:
  SequentialItem(const KerasTensor& input) : input_(input) {}
  template <class L, std::enable_if_t<std::is_convertible_v<L, LayerPtr>, int> = 0>
  SequentialItem(L&& layer) : layer_(std::forward<L>(layer)) {}
  const LayerPtr& layer() const { return layer_; }  // null for an Input
  const KerasTensor& input() const { return input_; }

 private:
  LayerPtr layer_;
  KerasTensor input_;
};

class SequentialImpl : public Model {
 public:
  explicit SequentialImpl(std::vector<LayerPtr> layers = {}, const std::string& name = "");
  // Sequential({Input({784}), Dense(256, "relu"), Dense(10)}): each entry
  // is add()ed in order, so an Input first builds the model at once.
  explicit SequentialImpl(std::initializer_list<SequentialItem> items, const std::string& name = "");
  // Registry form, as Keras 3 writes it: {"name", "trainable", "dtype",
  // "layers": [{"class_name": "InputLayer", ...}, {"class_name", "config"}...],
  // "build_input_shape": [null, 784]} (kiln's older "input_dtype" is read too).
  explicit SequentialImpl(const Json& config);
  std::string class_name() const override { return "Sequential"; }

  void add(LayerPtr layer);
  void add(const KerasTensor& input);  // sets the input shape and builds
  void pop();

  std::vector<LayerPtr> layers() const override { return layers_; }
  std::vector<Shape> input_shapes() const override;
  std::vector<at::ScalarType> input_dtypes() const override;

  void build(const std::vector<Shape>& input_shapes) override;
  Tensors call(const Tensors& inputs, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;
  bool supports_masking() const override { return true; }

 protected:
  // Carries each layer's output mask to the next layer (layer.h, masking).
  Tensors call_masked(const Tensors& inputs, const Tensors& masks, bool training, Tensors* output_masks) override;

 private:
  std::vector<LayerPtr> layers_;
  std::optional<Shape> input_shape_;  // with batch dim
  at::ScalarType input_dtype_ = at::kFloat;
  std::string input_name_;  // the InputLayer's name in the config
};
KILN_LAYER_HOLDER(Sequential, std::initializer_list<SequentialItem>);

}  // namespace models

}  // namespace kiln

#define KILN_LEGACY_MODELS_SEQUENTIAL_H
#include "kiln/models/legacy_names.h"
