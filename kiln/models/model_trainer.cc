// Model's training and saving members, forwarded through the seam of
// kiln/models/model_trainer.h to the implementations kiln/training and
// kiln/saving register.
#include "kiln/models/model_trainer.h"

#include "kiln/core/error.h"
#include "kiln/models/model.h"

namespace kiln {
namespace {

std::unique_ptr<ModelTrainer>& trainer_slot() {
  static std::unique_ptr<ModelTrainer> trainer;
  return trainer;
}

std::unique_ptr<ModelSaver>& saver_slot() {
  static std::unique_ptr<ModelSaver> saver;
  return saver;
}

ModelTrainer& trainer(const char* member) {
  if (!trainer_slot())
    throw StateError(std::string("Model::") + member +
                     " is implemented by kiln's training library, which this program does not load: link "
                     "kiln::training (libkiln_training)");
  return *trainer_slot();
}

ModelSaver& saver(const char* member) {
  if (!saver_slot())
    throw StateError(std::string(member) +
                     " is implemented by kiln's saving library, which this program does not load: link "
                     "kiln::saving (libkiln_saving)");
  return *saver_slot();
}

}  // namespace

bool register_model_trainer(std::unique_ptr<ModelTrainer> t) {
  trainer_slot() = std::move(t);
  return true;
}

bool register_model_saver(std::unique_ptr<ModelSaver> s) {
  saver_slot() = std::move(s);
  return true;
}

// --- training ------------------------------------------------------------------

void models::Model::compile(const CompileArgs& compile_args) {
  CompileArgs args = compile_args;
  auto state = trainer("compile").compile(*this, args);
  train_state_ = std::move(state);
  compile_args_ = std::make_unique<CompileArgs>(std::move(args));
}

void models::Model::compile(const std::string& optimizer, const std::string& loss,
                            const std::vector<std::string>& metrics) {
  compile(CompileArgs::from_names(optimizer, loss, metrics));
}

bool models::Model::compiled() const { return train_state_ != nullptr; }

TrainState& models::Model::train_state() {
  if (!train_state_) throw StateError("model '" + name() + "' is not compiled; call compile() first");
  return *train_state_;
}

const CompileArgs& models::Model::compile_args() const {
  if (!compile_args_) throw StateError("model '" + name() + "' is not compiled; call compile() first");
  return *compile_args_;
}

History models::Model::fit(const FitArgs& args) { return trainer("fit").fit(*this, args); }

std::map<std::string, double> models::Model::evaluate(const EvaluateArgs& args) {
  return trainer("evaluate").evaluate(*this, args);
}

Tensors models::Model::predict(const Tensors& x, const PredictArgs& args) {
  return trainer("predict").predict(*this, x, args);
}

at::Tensor models::Model::predict(const at::Tensor& x, const PredictArgs& args) {
  Tensors out = predict(Tensors{x}, args);
  if (out.size() != 1)
    throw ValueError("predict: model '" + name() + "' has " + std::to_string(out.size()) +
                     " outputs; call predict with a vector of inputs to get them all");
  return out[0];
}

Tensors models::Model::predict(const data::Dataset& ds, const PredictArgs& args) {
  return trainer("predict").predict(*this, ds, args);
}

Tensors models::Model::predict(const Tensors& x, int64_t batch_size, int verbose) {
  return predict(x, PredictArgs{.batch_size = batch_size, .verbose = verbose});
}

at::Tensor models::Model::predict(const at::Tensor& x, int64_t batch_size, int verbose) {
  return predict(x, PredictArgs{.batch_size = batch_size, .verbose = verbose});
}

Tensors models::Model::predict(const data::Dataset& ds, int verbose) {
  return predict(ds, PredictArgs{.verbose = verbose});
}

std::map<std::string, double> models::Model::train_step(const Batch& data) {
  return trainer("train_step").train_step(*this, data);
}

std::map<std::string, double> models::Model::test_step(const Batch& data) {
  return trainer("test_step").test_step(*this, data);
}

Tensors models::Model::predict_step(const Tensors& x) { return (*this)(x, /*training=*/false); }

void models::Model::reset_metrics() { trainer("reset_metrics").reset_metrics(*this); }

std::map<std::string, double> models::Model::train_on_batch(const Tensors& x, const Tensors& y,
                                                            const at::Tensor& sample_weight) {
  return trainer("train_on_batch").train_on_batch(*this, x, y, sample_weight);
}

std::map<std::string, double> models::Model::test_on_batch(const Tensors& x, const Tensors& y,
                                                           const at::Tensor& sample_weight) {
  return trainer("test_on_batch").test_on_batch(*this, x, y, sample_weight);
}

Tensors models::Model::predict_on_batch(const Tensors& x) {
  return trainer("predict_on_batch").predict_on_batch(*this, x);
}

// --- saving --------------------------------------------------------------------

void models::Model::save(const std::string& dir, bool include_optimizer) {
  saver("Model::save").save(*this, dir, include_optimizer);
}

void models::Model::save_weights(const std::string& path) { saver("Model::save_weights").save_weights(*this, path); }

void models::Model::load_weights(const std::string& path) { saver("Model::load_weights").load_weights(*this, path); }

ModelPtr load_model(const std::string& dir) { return saver("load_model").load_model(dir); }

}  // namespace kiln
