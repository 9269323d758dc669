// Model: a Layer that groups layers and can be trained, evaluated, saved and
// served. Sequential, Functional and user subclasses derive from it.
//
// As in Keras 3 (where the training loop is a Trainer apart from Model), the
// training and saving entry points are members here, but Model forwards them
// through the seam of kiln/models/model_trainer.h to the implementations
// kiln/training (trainer.cc) and kiln/saving (model_io.cc) register: the
// models library links neither, so its folder depends on nothing above it.
//
//   auto model = std::make_shared<Sequential>(std::vector<LayerPtr>{
//       std::make_shared<Dense>(256, "relu"), std::make_shared<Dense>(10)});
//   model->compile(CompileArgs::from_names("adam", "sparse_categorical_crossentropy", {"accuracy"}));
//   History h = model->fit({.x = {x}, .y = {y}, .epochs = 5, .validation_split = 0.1});
//   model->save("models/fashion_mnist/1");
//
// Subclassing: derive from Model, create sublayers in the constructor and
// track() them, implement call() and class_name(); register it with
// KILN_REGISTER_LAYER to make save/load_model work (get_config must hold
// the constructor's arguments).
#pragma once

#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/layers/layer.h"
#include "kiln/models/fit_args.h"

namespace kiln {

class TrainState;  // kiln/training: compiled state (optimizer, loss, metrics, step pipeline)

namespace models {

class Model : public Layer {
 public:
  explicit Model(const Json& config = Json::object());
  ~Model() override;

  // --- structure -----------------------------------------------------------
  // Top-level layers in order (Functional: topological, inputs first).
  virtual std::vector<LayerPtr> layers() const { return sublayers(); }
  LayerPtr get_layer(const std::string& name) const;  // NotFoundError lists names
  // What the model takes and gives (batch dim kNone). Known once built or,
  // for Functional/Sequential with an Input, from construction.
  virtual std::vector<Shape> input_shapes() const { return build_input_shapes(); }
  virtual std::vector<at::ScalarType> input_dtypes() const;
  virtual std::vector<std::string> input_names() const;
  std::vector<Shape> output_shapes();
  virtual std::vector<std::string> output_names() const;
  // Subclassed models: runs call() once on zeros of these shapes (float32)
  // so lazily built sublayers create their variables, and counts the
  // outputs (default output_names(): "output_0", "output_1", ...). Override
  // when the model takes integer inputs. Called directly (Keras's
  // model.build(shape)) it is build_if_needed: variables under the model's
  // name scope ("two_heads/dense/kernel") and the model marked built.
  void build(const std::vector<Shape>& input_shapes) override;
  size_t num_inputs() const { return input_shapes().empty() ? 1 : input_shapes().size(); }

  // Keras's table: Layer (type), Output Shape, Param #; totals (trainable /
  // non-trainable). Implemented in models/summary.cc.
  void summary(std::ostream& os = std::cout, int line_length = 0);
  std::string summary_string(int line_length = 0);

  // --- training (kiln/training/trainer.cc, through model_trainer.h) ---------
  void compile(const CompileArgs& args);
  void compile(const std::string& optimizer, const std::string& loss, const std::vector<std::string>& metrics = {});
  bool compiled() const;
  TrainState& train_state();  // StateError "call compile() first" if not compiled
  const CompileArgs& compile_args() const;

  History fit(const FitArgs& args);
  std::map<std::string, double> evaluate(const EvaluateArgs& args);
  // Batched inference (training=false, no grad), one predict_step per
  // batch. One tensor per output, on the host:
  //   Tensors p = model->predict(x, {.batch_size = 256, .verbose = 1});
  Tensors predict(const Tensors& x, const PredictArgs& args = {});
  at::Tensor predict(const at::Tensor& x, const PredictArgs& args = {});   // one input, one output
  Tensors predict(const data::Dataset& ds, const PredictArgs& args = {});  // args.batch_size unused
  // The spellings before PredictArgs; kept for one release.
  [[deprecated("use predict(x, PredictArgs{.batch_size = ..., .verbose = ...})")]] Tensors predict(const Tensors& x,
                                                                                                   int64_t batch_size,
                                                                                                   int verbose = 0);
  [[deprecated("use predict(x, PredictArgs{.batch_size = ..., .verbose = ...})")]] at::Tensor predict(
      const at::Tensor& x, int64_t batch_size, int verbose = 0);
  [[deprecated("use predict(ds, PredictArgs{.verbose = ...})")]] Tensors predict(const data::Dataset& ds, int verbose);

  // --- custom training logic (Keras's train_step / test_step / predict_step) --
  // fit() calls train_step once per batch, evaluate() and fit()'s
  // validation call test_step, predict() calls predict_step; train_on_batch,
  // test_on_batch and predict_on_batch call them too. Override them in a
  // subclass for custom training logic instead of editing the step pipeline
  // (docs/DESIGN.md, "Custom training logic: train_step"):
  //
  //   std::map<std::string, double> train_step(const Batch& data) override {
  //     TrainState& ts = train_state();  // kiln/training/train_state.h
  //     at::Tensor loss = ts.loss()(data.y[0], (*this)(data.x, true)[0]);
  //     ... gradients of `loss`, ts.optimizer().apply_gradients(grads, vars) ...
  //     return {{"loss", loss.item<double>()}};
  //   }
  //
  // Return the logs (metric name -> value) the callbacks and History see
  // for this batch. The defaults run the compiled step pipeline
  // (TrainState::train_step / test_step) and return {}: "the compiled
  // metrics' running results", which fit() reads only when callbacks need
  // them (no host round trip per step; steps_per_execution holds). An
  // override may call Model::train_step(data) and then return {} as well.
  // A non-empty return replaces those logs for that batch.
  virtual std::map<std::string, double> train_step(const Batch& data);
  virtual std::map<std::string, double> test_step(const Batch& data);
  // The default is (*this)(x, /*training=*/false); predict() runs it with
  // gradients off.
  virtual Tensors predict_step(const Tensors& x);
  // One optimizer step on one batch; returns {"loss": ..., metrics...} for
  // that batch only: like Keras 3 (since keras-team/keras#22617), the
  // metrics are reset at the start of each call, so the values are not
  // running averages over earlier calls. test_on_batch likewise (no update).
  std::map<std::string, double> train_on_batch(const Tensors& x, const Tensors& y,
                                               const at::Tensor& sample_weight = at::Tensor());
  std::map<std::string, double> test_on_batch(const Tensors& x, const Tensors& y,
                                              const at::Tensor& sample_weight = at::Tensor());
  // Resets the loss tracker and every compiled metric (Keras's
  // Model.reset_metrics). StateError if not compiled.
  void reset_metrics();
  Tensors predict_on_batch(const Tensors& x);

  // Set by callbacks (EarlyStopping) to end fit() after the current epoch.
  bool stop_training = false;

  // --- saving (kiln/saving/model_io.cc, through model_trainer.h) ------------
  // Writes the model directory (model.json, weights.safetensors, optionally
  // optimizer.safetensors) atomically.
  void save(const std::string& dir, bool include_optimizer = true);
  // safetensors keyed by variable path.
  void save_weights(const std::string& path);
  void load_weights(const std::string& path);

  Json get_config() const override;

  // --- quantization (kiln/quantization) -------------------------------------
  // Keras's model.quantize(mode): quantizes every layer inside that supports
  // `mode` ("int8": Dense, EinsumDense, Embedding; "float8" and "int8_qat":
  // Dense, EinsumDense). The model must be built. ValueError when no layer
  // supports it. A compiled model keeps its compile config; optimizer state
  // of replaced kernels is dropped on the next fit.
  void quantize(const std::string& mode) override;
  bool supports_quantization(const std::string& mode) const override;
  // "" when no layer is quantized, else the modes in use ("int8", "float8").
  std::string quantization_summary() const;

 protected:
  // For build() overrides: when build() was called directly rather than
  // through build_if_needed, runs build_if_needed (the model's name scope,
  // marked built) and returns true: the override returns at once.
  bool build_in_own_scope(const std::vector<Shape>& input_shapes);

  std::shared_ptr<TrainState> train_state_;  // shared_ptr: TrainState is incomplete here
  std::unique_ptr<CompileArgs> compile_args_;
  size_t num_outputs_ = 1;  // counted by build()
};

}  // namespace models

using ModelPtr = std::shared_ptr<models::Model>;

// Restores a model directory written by Model::save (kiln/saving/model_io.cc,
// through model_trainer.h):
// architecture, weights (bit-identical predictions), compile config and
// optimizer state when present.
ModelPtr load_model(const std::string& dir);

// Warns once per process (stderr) when a dtype policy or quantization mode
// the model uses cannot run fast on this CPU: fit(), evaluate() and
// predict() call it (kiln/core/cpu_features.h says why and what is faster).
void warn_about_slow_precision(const models::Model& model);

// keras.models.load_model.
namespace models {
using ::kiln::load_model;
using ::kiln::ModelPtr;
}  // namespace models

}  // namespace kiln

#define KILN_LEGACY_MODELS_MODEL_H
#include "kiln/models/legacy_names.h"
