#include "kiln/training/callback.h"

#include <cmath>
#include <iostream>

#include "kiln/core/error.h"
#include "kiln/models/model.h"
#include "kiln/training/progbar.h"
#include "kiln/training/train_state.h"

namespace kiln {

Model& Callback::model() const {
  if (!model_)
    throw StateError("this callback has no model; it is only usable inside fit()/evaluate()/predict()");
  return *model_;
}

void warn(const std::string& message) { std::cerr << "kiln: WARNING: " << message << std::endl; }

void check_mode(const std::string& owner, const std::string& mode) {
  if (mode != "auto" && mode != "min" && mode != "max")
    throw ValueError(
        owner +
        ": received an invalid value for `mode`, expected \"auto\", \"min\" or \"max\". Received: mode=\"" +
        mode + "\"");
}

bool monitor_is_max(const std::string& monitor, const std::string& mode, Model* model) {
  if (mode == "max") return true;
  if (mode == "min") return false;
  if (model && model->compiled()) {
    if (auto dir = model->train_state().higher_is_better(monitor)) return *dir;
  }
  return monitor.find("acc") != std::string::npos || monitor.find("auc") != std::string::npos ||
         monitor.rfind("fmeasure", 0) == 0;
}

// --- CallbackList ------------------------------------------------------------

CallbackList::CallbackList(std::vector<CallbackPtr> callbacks, bool add_history, bool add_progbar,
                           Model* model, const Json& params)
    : callbacks_(std::move(callbacks)) {
  for (auto& cb : callbacks_) {
    if (!cb) throw ValueError("callbacks: received a null callback");
    if (auto h = dynamic_cast<HistoryCallback*>(cb.get())) history_ = h;
    if (auto p = dynamic_cast<ProgbarLogger*>(cb.get())) progbar_ = p;
  }
  if (!history_ && add_history) {
    auto h = std::make_shared<HistoryCallback>();
    history_ = h.get();
    callbacks_.push_back(h);
  }
  if (!progbar_ && add_progbar) {
    auto p = std::make_shared<ProgbarLogger>();
    progbar_ = p.get();
    callbacks_.push_back(p);
  }
  set_model(model);
  set_params(params);
  for (auto& cb : callbacks_) {
    cb->set_model(model);
    cb->set_params(params);
  }
}

void CallbackList::on_train_begin(const Logs& logs) {
  for (auto& cb : callbacks_) cb->on_train_begin(logs);
}
void CallbackList::on_train_end(const Logs& logs) {
  for (auto& cb : callbacks_) cb->on_train_end(logs);
}
void CallbackList::on_epoch_begin(int epoch, const Logs& logs) {
  for (auto& cb : callbacks_) cb->on_epoch_begin(epoch, logs);
}
void CallbackList::on_epoch_end(int epoch, Logs& logs) {
  for (auto& cb : callbacks_) cb->on_epoch_end(epoch, logs);
}
void CallbackList::on_train_batch_begin(int64_t batch, const Logs& logs) {
  for (auto& cb : callbacks_) cb->on_train_batch_begin(batch, logs);
}
void CallbackList::on_train_batch_end(int64_t batch, const Logs& logs) {
  for (auto& cb : callbacks_) cb->on_train_batch_end(batch, logs);
}
void CallbackList::on_test_begin(const Logs& logs) {
  for (auto& cb : callbacks_) cb->on_test_begin(logs);
}
void CallbackList::on_test_end(const Logs& logs) {
  for (auto& cb : callbacks_) cb->on_test_end(logs);
}
void CallbackList::on_test_batch_begin(int64_t batch, const Logs& logs) {
  for (auto& cb : callbacks_) cb->on_test_batch_begin(batch, logs);
}
void CallbackList::on_test_batch_end(int64_t batch, const Logs& logs) {
  for (auto& cb : callbacks_) cb->on_test_batch_end(batch, logs);
}
void CallbackList::on_predict_begin(const Logs& logs) {
  for (auto& cb : callbacks_) cb->on_predict_begin(logs);
}
void CallbackList::on_predict_end(const Logs& logs) {
  for (auto& cb : callbacks_) cb->on_predict_end(logs);
}
void CallbackList::on_predict_batch_begin(int64_t batch, const Logs& logs) {
  for (auto& cb : callbacks_) cb->on_predict_batch_begin(batch, logs);
}
void CallbackList::on_predict_batch_end(int64_t batch, const Logs& logs) {
  for (auto& cb : callbacks_) cb->on_predict_batch_end(batch, logs);
}

// --- History -----------------------------------------------------------------

void HistoryCallback::on_train_begin(const Logs&) {
  history_ = History();
  history_.params = params();
}

void HistoryCallback::on_epoch_end(int epoch, Logs& logs) {
  history_.epoch.push_back(epoch);
  for (auto& [k, v] : logs) history_.history[k].push_back(v);
}

// --- TerminateOnNaN ----------------------------------------------------------

void TerminateOnNaN::on_train_batch_end(int64_t batch, const Logs& logs) {
  auto it = logs.find("loss");
  if (it != logs.end() && !std::isfinite(it->second)) {
    std::cout << "Batch " << batch << ": Invalid loss, terminating training" << std::endl;
    model().stop_training = true;
  }
}

}  // namespace kiln
