// Callback: hooks fit(), evaluate() and predict() call, with Keras's names
// and order. Subclass and override what you need:
//
//   class PrintLoss : public Callback {
//     void on_epoch_end(int epoch, Logs& logs) override {
//       std::cout << epoch << " " << logs.at("loss") << "\n";
//     }
//   };
//   model->fit({.x = {x}, .y = {y}, .callbacks = {std::make_shared<PrintLoss>()}});
//
// Logs hold the running averages of "loss" and each metric over the batches
// seen so far in the epoch (batch hooks) or the whole epoch plus "val_*"
// entries (on_epoch_end). on_epoch_end receives the logs mutably: a callback
// may add entries (ReduceLROnPlateau adds "learning_rate") that the callbacks
// after it, and History, see — as in Keras, where the dict is shared.
//
// `model()` is the model being trained (borrowed: set by fit() for its
// duration). `params()` is {"verbose", "epochs", "steps"} (steps null when
// unknown) plus "do_validation".
//
// Order: on_train_begin, then per epoch on_epoch_begin, on_train_batch_begin/
// end per batch, (validation: on_test_begin, on_test_batch_*, on_test_end),
// on_epoch_end; finally on_train_end. An exception thrown from a callback
// ends fit() without on_train_end (an interrupted run; see BackupAndRestore).
//
// State for exact resume: a callback whose decisions depend on earlier
// epochs (a patience counter, a best value, best weights, a file position)
// returns that state from get_state() / get_state_tensors(). BackupAndRestore
// stores every callback's state in each checkpoint and, on resume, fit()
// hands it back through set_state() / set_state_tensors() after all
// on_train_begin calls and before the first epoch, so the resumed run acts
// as the uninterrupted one would have. Every built-in stateful callback
// implements it; a user callback does the same:
//
//   class CountEpochs : public Callback {
//     int seen = 0;
//     void on_epoch_end(int, Logs&) override { ++seen; }
//     Json get_state() const override { return {{"seen", seen}}; }
//     void set_state(const Json& s) override { seen = s.at("seen").get<int>(); }
//   };
//
// State is matched by the callback's position in the list and its
// state_name() (default: "callback"); a mismatch (another program's
// checkpoint) warns and leaves that callback fresh. Checkpoint writers
// (is_checkpointer()) see the state after every other callback acted: they
// run first in on_train_begin and last in on_train_batch_end/on_epoch_end.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/core/json.h"
#include "kiln/layers/layer_holder.h"
#include "kiln/models/fit_args.h"

namespace kiln {

namespace models {
class Model;
}
using Logs = std::map<std::string, double>;

namespace callbacks {

class Callback {
 public:
  virtual ~Callback() = default;

  void set_model(models::Model* model) { model_ = model; }
  // StateError if no model was set (the callback is not inside fit()).
  models::Model& model() const;
  bool has_model() const { return model_ != nullptr; }
  void set_params(const Json& params) { params_ = params; }
  const Json& params() const { return params_; }

  virtual void on_train_begin(const Logs& logs) {}
  virtual void on_train_end(const Logs& logs) {}
  virtual void on_epoch_begin(int epoch, const Logs& logs) {}
  virtual void on_epoch_end(int epoch, Logs& logs) {}
  virtual void on_train_batch_begin(int64_t batch, const Logs& logs) {}
  virtual void on_train_batch_end(int64_t batch, const Logs& logs) {}
  virtual void on_test_begin(const Logs& logs) {}
  virtual void on_test_end(const Logs& logs) {}
  virtual void on_test_batch_begin(int64_t batch, const Logs& logs) {}
  virtual void on_test_batch_end(int64_t batch, const Logs& logs) {}
  virtual void on_predict_begin(const Logs& logs) {}
  virtual void on_predict_end(const Logs& logs) {}
  virtual void on_predict_batch_begin(int64_t batch, const Logs& logs) {}
  virtual void on_predict_batch_end(int64_t batch, const Logs& logs) {}

  // --- state for exact resume (see the top of this file) -------------------
  // JSON-able values; null (the default) means no state.
  virtual Json get_state() const { return nullptr; }
  virtual void set_state(const Json& state) {}
  // Tensors (e.g. best weights), stored in the checkpoint's safetensors.
  virtual std::map<std::string, at::Tensor> get_state_tensors() const { return {}; }
  virtual void set_state_tensors(const std::map<std::string, at::Tensor>& tensors) {}
  // Stored with the state and checked on restore.
  virtual std::string state_name() const { return "callback"; }
  // True for callbacks that write checkpoints of the training state.
  virtual bool is_checkpointer() const { return false; }

 private:
  models::Model* model_ = nullptr;
  Json params_ = Json::object();
};

}  // namespace callbacks

namespace callbacks {
class HistoryCallback;
}
namespace callbacks {
class ProgbarLoggerImpl;
}

namespace callbacks {

// Calls every callback in order. Like Keras's CallbackList, it appends a
// HistoryCallback (fit) and a ProgbarLogger (verbose != 0) unless the list
// already holds one.
class CallbackList : public Callback {
 public:
  CallbackList(std::vector<CallbackPtr> callbacks, bool add_history, bool add_progbar, models::Model* model,
               const Json& params);

  const std::vector<CallbackPtr>& callbacks() const { return callbacks_; }
  HistoryCallback* history() const { return history_; }
  ProgbarLoggerImpl* progbar() const { return progbar_; }

  // Every callback's get_state()/get_state_tensors(): JSON
  // {"<index>": {"name": state_name(), "state": ...}} (callbacks with state
  // only) and tensors keyed "<index>/<tensor name>".
  struct States {
    Json json = Json::object();
    std::map<std::string, at::Tensor> tensors;
  };
  States get_states() const;
  // Gives each callback its saved state (matched by index and name; a
  // mismatch warns and leaves that callback as it is).
  void set_states(const States& states);

  void on_train_begin(const Logs& logs) override;
  void on_train_end(const Logs& logs) override;
  void on_epoch_begin(int epoch, const Logs& logs) override;
  void on_epoch_end(int epoch, Logs& logs) override;
  void on_train_batch_begin(int64_t batch, const Logs& logs) override;
  void on_train_batch_end(int64_t batch, const Logs& logs) override;
  void on_test_begin(const Logs& logs) override;
  void on_test_end(const Logs& logs) override;
  void on_test_batch_begin(int64_t batch, const Logs& logs) override;
  void on_test_batch_end(int64_t batch, const Logs& logs) override;
  void on_predict_begin(const Logs& logs) override;
  void on_predict_end(const Logs& logs) override;
  void on_predict_batch_begin(int64_t batch, const Logs& logs) override;
  void on_predict_batch_end(int64_t batch, const Logs& logs) override;

 private:
  std::vector<CallbackPtr> callbacks_;
  HistoryCallback* history_ = nullptr;
  ProgbarLoggerImpl* progbar_ = nullptr;
};

// Records per-epoch logs; fit() returns its History. Keras's History
// callback (renamed: kiln::History is the record fit() returns).
class HistoryCallback : public Callback {
 public:
  void on_train_begin(const Logs& logs) override;
  void on_epoch_end(int epoch, Logs& logs) override;
  const History& history() const { return history_; }

 private:
  History history_;
};

// Callbacks from plain functions (Keras's LambdaCallback). Unset members do
// nothing.
class LambdaCallbackImpl : public Callback {
 public:
  std::function<void(const Logs&)> on_train_begin_fn, on_train_end_fn;
  std::function<void(int, const Logs&)> on_epoch_begin_fn;
  std::function<void(int, Logs&)> on_epoch_end_fn;
  std::function<void(int64_t, const Logs&)> on_train_batch_begin_fn, on_train_batch_end_fn;

  void on_train_begin(const Logs& logs) override {
    if (on_train_begin_fn) on_train_begin_fn(logs);
  }
  void on_train_end(const Logs& logs) override {
    if (on_train_end_fn) on_train_end_fn(logs);
  }
  void on_epoch_begin(int epoch, const Logs& logs) override {
    if (on_epoch_begin_fn) on_epoch_begin_fn(epoch, logs);
  }
  void on_epoch_end(int epoch, Logs& logs) override {
    if (on_epoch_end_fn) on_epoch_end_fn(epoch, logs);
  }
  void on_train_batch_begin(int64_t batch, const Logs& logs) override {
    if (on_train_batch_begin_fn) on_train_batch_begin_fn(batch, logs);
  }
  void on_train_batch_end(int64_t batch, const Logs& logs) override {
    if (on_train_batch_end_fn) on_train_batch_end_fn(batch, logs);
  }
};
KILN_LAYER_HOLDER(LambdaCallback, void);

// Stops training when the loss becomes NaN or infinite (Keras's
// TerminateOnNaN).
class TerminateOnNaNImpl : public Callback {
 public:
  void on_train_batch_end(int64_t batch, const Logs& logs) override;
};
KILN_LAYER_HOLDER(TerminateOnNaN, void);

}  // namespace callbacks

// Which direction "improves" for a monitored quantity: Keras's "auto" rule —
// a compiled metric's own direction when the model knows it, otherwise
// names containing "acc"/"auc" (and "fmeasure") are maximised, the rest
// minimised. mode is "auto", "min" or "max".
bool monitor_is_max(const std::string& monitor, const std::string& mode, models::Model* model);
// ValueError naming the received mode unless it is auto/min/max.
void check_mode(const std::string& owner, const std::string& mode);

// Writes a warning line to stderr ("kiln: WARNING: ...").
void warn(const std::string& message);

// Doubles in callback state, exact and including inf/nan (JSON numbers
// cannot hold them): a number, or "inf"/"-inf"/"nan".
Json state_double(double v);
double state_double(const Json& j);

}  // namespace kiln

#define KILN_LEGACY_CALLBACKS_CALLBACK_H
#include "kiln/training/legacy_names.h"
