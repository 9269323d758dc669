// The seam between Model and the two libraries above it that implement its
// training and saving members: kiln/training (compile, fit, evaluate,
// predict, the *_on_batch forms, the default train_step and test_step) and kiln/saving (save, save_weights,
// load_weights, load_model).
//
// Keras 3 splits the training loop out of Model into a Trainer; kiln keeps
// the Keras API (model->fit(...), model->save(...) are Model's members) but
// Model only forwards to the ModelTrainer and ModelSaver registered here, so
// libkiln_models depends on neither library: training and saving depend on
// models, never the reverse. Each library registers its implementation from a
// static initializer when it loads (kiln/training/trainer.cc,
// kiln/saving/model_io.cc), and CMake makes every program that links
// kiln::training or kiln::saving load it (CMakeLists.txt, kiln_load_always).
// A program that links neither gets a StateError naming the library to link.
//
// Registration happens while libraries load, before main(); the registered
// objects live for the whole process.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "kiln/models/fit_args.h"

namespace kiln {

namespace models {
class Model;
}
class TrainState;

class ModelTrainer {
 public:
  virtual ~ModelTrainer() = default;
  // The compiled state for `args`; may adjust `args` (mixed_float16 wraps the
  // optimizer in a LossScaleOptimizer), which Model then keeps as its
  // compile_args().
  virtual std::shared_ptr<TrainState> compile(models::Model& model, CompileArgs& args) = 0;
  virtual History fit(models::Model& model, const FitArgs& args) = 0;
  virtual std::map<std::string, double> evaluate(models::Model& model, const EvaluateArgs& args) = 0;
  virtual Tensors predict(models::Model& model, const Tensors& x, const PredictArgs& args) = 0;
  virtual Tensors predict(models::Model& model, const data::Dataset& ds, const PredictArgs& args) = 0;
  // Model::train_step / test_step's defaults: the compiled step pipeline on
  // one batch; {} (the compiled metrics are the logs).
  virtual std::map<std::string, double> train_step(models::Model& model, const Batch& data) = 0;
  virtual std::map<std::string, double> test_step(models::Model& model, const Batch& data) = 0;
  virtual std::map<std::string, double> train_on_batch(models::Model& model, const Tensors& x, const Tensors& y,
                                                       const at::Tensor& sample_weight) = 0;
  virtual std::map<std::string, double> test_on_batch(models::Model& model, const Tensors& x, const Tensors& y,
                                                      const at::Tensor& sample_weight) = 0;
  virtual Tensors predict_on_batch(models::Model& model, const Tensors& x) = 0;
  virtual void reset_metrics(models::Model& model) = 0;
};

class ModelSaver {
 public:
  virtual ~ModelSaver() = default;
  virtual void save(models::Model& model, const std::string& dir, bool include_optimizer) = 0;
  virtual void save_weights(models::Model& model, const std::string& path) = 0;
  virtual void load_weights(models::Model& model, const std::string& path) = 0;
  virtual std::shared_ptr<models::Model> load_model(const std::string& dir) = 0;
};

// Install the implementation (one per process; a second replaces the first).
// Returns true, for use in a static initializer.
bool register_model_trainer(std::unique_ptr<ModelTrainer> trainer);
bool register_model_saver(std::unique_ptr<ModelSaver> saver);

}  // namespace kiln
