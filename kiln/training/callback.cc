#include "kiln/training/callback.h"

#include <cmath>
#include <iostream>
#include <limits>

#include "kiln/core/error.h"
#include "kiln/models/model.h"
#include "kiln/training/progbar.h"
#include "kiln/training/train_state.h"

namespace kiln {

models::Model& callbacks::Callback::model() const {
  if (!model_) throw StateError("this callback has no model; it is only usable inside fit()/evaluate()/predict()");
  return *model_;
}

void warn(const std::string& message) { std::cerr << "kiln: WARNING: " << message << std::endl; }

void check_mode(const std::string& owner, const std::string& mode) {
  if (mode != "auto" && mode != "min" && mode != "max")
    throw ValueError(
        owner + ": received an invalid value for `mode`, expected \"auto\", \"min\" or \"max\". Received: mode=\"" +
        mode + "\"");
}

bool monitor_is_max(const std::string& monitor, const std::string& mode, models::Model* model) {
  if (mode == "max") return true;
  if (mode == "min") return false;
  if (model && model->compiled()) {
    if (auto dir = model->train_state().higher_is_better(monitor)) return *dir;
  }
  return monitor.find("acc") != std::string::npos || monitor.find("auc") != std::string::npos ||
         monitor.rfind("fmeasure", 0) == 0;
}

// --- CallbackList ------------------------------------------------------------

callbacks::CallbackList::CallbackList(std::vector<CallbackPtr> callbacks, bool add_history, bool add_progbar,
                                      models::Model* model, const Json& params)
    : callbacks_(std::move(callbacks)) {
  for (auto& cb : callbacks_) {
    if (!cb) throw ValueError("callbacks: received a null callback");
    if (auto h = dynamic_cast<callbacks::HistoryCallback*>(cb.get())) history_ = h;
    if (auto p = dynamic_cast<callbacks::ProgbarLoggerImpl*>(cb.get())) progbar_ = p;
  }
  if (!history_ && add_history) {
    auto h = std::make_shared<callbacks::HistoryCallback>();
    history_ = h.get();
    callbacks_.push_back(h);
  }
  if (!progbar_ && add_progbar) {
    auto p = callbacks::ProgbarLogger();
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

void callbacks::CallbackList::on_train_begin(const Logs& logs) {
  // Checkpoint writers first: BackupAndRestore restores the weights and
  // sets the resume point the others may look at.
  for (auto& cb : callbacks_)
    if (cb->is_checkpointer()) cb->on_train_begin(logs);
  for (auto& cb : callbacks_)
    if (!cb->is_checkpointer()) cb->on_train_begin(logs);
}
void callbacks::CallbackList::on_train_end(const Logs& logs) {
  for (auto& cb : callbacks_) cb->on_train_end(logs);
}
void callbacks::CallbackList::on_epoch_begin(int epoch, const Logs& logs) {
  for (auto& cb : callbacks_) cb->on_epoch_begin(epoch, logs);
}
void callbacks::CallbackList::on_epoch_end(int epoch, Logs& logs) {
  // Checkpoint writers last: a checkpoint holds the state after every other
  // callback acted on this epoch (a reduced learning rate, a patience count).
  for (auto& cb : callbacks_)
    if (!cb->is_checkpointer()) cb->on_epoch_end(epoch, logs);
  for (auto& cb : callbacks_)
    if (cb->is_checkpointer()) cb->on_epoch_end(epoch, logs);
}
void callbacks::CallbackList::on_train_batch_begin(int64_t batch, const Logs& logs) {
  for (auto& cb : callbacks_) cb->on_train_batch_begin(batch, logs);
}
void callbacks::CallbackList::on_train_batch_end(int64_t batch, const Logs& logs) {
  for (auto& cb : callbacks_)
    if (!cb->is_checkpointer()) cb->on_train_batch_end(batch, logs);
  for (auto& cb : callbacks_)
    if (cb->is_checkpointer()) cb->on_train_batch_end(batch, logs);
}
void callbacks::CallbackList::on_test_begin(const Logs& logs) {
  for (auto& cb : callbacks_) cb->on_test_begin(logs);
}
void callbacks::CallbackList::on_test_end(const Logs& logs) {
  for (auto& cb : callbacks_) cb->on_test_end(logs);
}
void callbacks::CallbackList::on_test_batch_begin(int64_t batch, const Logs& logs) {
  for (auto& cb : callbacks_) cb->on_test_batch_begin(batch, logs);
}
void callbacks::CallbackList::on_test_batch_end(int64_t batch, const Logs& logs) {
  for (auto& cb : callbacks_) cb->on_test_batch_end(batch, logs);
}
void callbacks::CallbackList::on_predict_begin(const Logs& logs) {
  for (auto& cb : callbacks_) cb->on_predict_begin(logs);
}
void callbacks::CallbackList::on_predict_end(const Logs& logs) {
  for (auto& cb : callbacks_) cb->on_predict_end(logs);
}
void callbacks::CallbackList::on_predict_batch_begin(int64_t batch, const Logs& logs) {
  for (auto& cb : callbacks_) cb->on_predict_batch_begin(batch, logs);
}
void callbacks::CallbackList::on_predict_batch_end(int64_t batch, const Logs& logs) {
  for (auto& cb : callbacks_) cb->on_predict_batch_end(batch, logs);
}

callbacks::CallbackList::States callbacks::CallbackList::get_states() const {
  States out;
  for (size_t i = 0; i < callbacks_.size(); ++i) {
    const callbacks::Callback& cb = *callbacks_[i];
    Json state = cb.get_state();
    auto tensors = cb.get_state_tensors();
    if (state.is_null() && tensors.empty()) continue;
    const std::string key = std::to_string(i);
    Json names = Json::array();
    for (auto& [name, t] : tensors) {
      out.tensors[key + "/" + name] = t.detach().clone();
      names.push_back(name);
    }
    out.json[key] = Json{{"name", cb.state_name()}, {"state", state}, {"tensors", names}};
  }
  return out;
}

void callbacks::CallbackList::set_states(const States& states) {
  std::vector<bool> used(callbacks_.size(), false);
  for (auto& [key, entry] : states.json.items()) {
    size_t i = 0;
    try {
      i = std::stoul(key);
    } catch (const std::exception&) {
      i = callbacks_.size();
    }
    const std::string name = entry.value("name", "");
    if (i >= callbacks_.size() || callbacks_[i]->state_name() != name) {
      warn("the checkpoint holds state for callback " + key + " (" + name +
           ") that this run's callbacks do not match; it starts fresh. Resume with the same callbacks for an "
           "exact continuation");
      continue;
    }
    std::map<std::string, at::Tensor> tensors;
    for (auto& n : entry.value("tensors", Json::array())) {
      auto it = states.tensors.find(key + "/" + n.get<std::string>());
      if (it != states.tensors.end()) tensors[n.get<std::string>()] = it->second;
    }
    callbacks::Callback& cb = *callbacks_[i];
    cb.set_state(entry.value("state", Json()));
    if (!tensors.empty()) cb.set_state_tensors(tensors);
    used[i] = true;
  }
  for (size_t i = 0; i < callbacks_.size(); ++i) {
    const callbacks::Callback& cb = *callbacks_[i];
    if (used[i] || cb.is_checkpointer()) continue;
    if (!cb.get_state().is_null() || !cb.get_state_tensors().empty())
      warn("the checkpoint holds no state for callback " + std::to_string(i) + " (" + cb.state_name() +
           "); it starts fresh");
  }
}

Json state_double(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

double state_double(const Json& j) {
  if (j.is_number()) return j.get<double>();
  if (j.is_string()) {
    const std::string s = j.get<std::string>();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
  }
  throw FormatError("callback state: expected a number or \"inf\"/\"-inf\"/\"nan\". Received: " + j.dump());
}

// --- History -----------------------------------------------------------------

void callbacks::HistoryCallback::on_train_begin(const Logs&) {
  history_ = History();
  history_.params = params();
}

void callbacks::HistoryCallback::on_epoch_end(int epoch, Logs& logs) {
  history_.epoch.push_back(epoch);
  for (auto& [k, v] : logs) history_.history[k].push_back(v);
}

// --- TerminateOnNaN ----------------------------------------------------------

void callbacks::TerminateOnNaNImpl::on_train_batch_end(int64_t batch, const Logs& logs) {
  auto it = logs.find("loss");
  if (it != logs.end() && !std::isfinite(it->second)) {
    std::cout << "Batch " << batch << ": Invalid loss, terminating training" << std::endl;
    model().stop_training = true;
  }
}

}  // namespace kiln
