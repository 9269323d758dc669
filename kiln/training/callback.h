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
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/core/json.h"
#include "kiln/models/fit_args.h"

namespace kiln {

class Model;
using Logs = std::map<std::string, double>;

class Callback {
 public:
  virtual ~Callback() = default;

  void set_model(Model* model) { model_ = model; }
  // StateError if no model was set (the callback is not inside fit()).
  Model& model() const;
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

 private:
  Model* model_ = nullptr;
  Json params_ = Json::object();
};

class HistoryCallback;
class ProgbarLogger;

// Calls every callback in order. Like Keras's CallbackList, it appends a
// HistoryCallback (fit) and a ProgbarLogger (verbose != 0) unless the list
// already holds one.
class CallbackList : public Callback {
 public:
  CallbackList(std::vector<CallbackPtr> callbacks, bool add_history, bool add_progbar, Model* model,
               const Json& params);

  const std::vector<CallbackPtr>& callbacks() const { return callbacks_; }
  HistoryCallback* history() const { return history_; }
  ProgbarLogger* progbar() const { return progbar_; }

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
  ProgbarLogger* progbar_ = nullptr;
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
class LambdaCallback : public Callback {
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

// Stops training when the loss becomes NaN or infinite (Keras's
// TerminateOnNaN).
class TerminateOnNaN : public Callback {
 public:
  void on_train_batch_end(int64_t batch, const Logs& logs) override;
};

// Which direction "improves" for a monitored quantity: Keras's "auto" rule —
// a compiled metric's own direction when the model knows it, otherwise
// names containing "acc"/"auc" (and "fmeasure") are maximised, the rest
// minimised. mode is "auto", "min" or "max".
bool monitor_is_max(const std::string& monitor, const std::string& mode, Model* model);
// ValueError naming the received mode unless it is auto/min/max.
void check_mode(const std::string& owner, const std::string& mode);

// Writes a warning line to stderr ("kiln: WARNING: ...").
void warn(const std::string& message);

}  // namespace kiln
