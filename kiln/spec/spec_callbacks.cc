// Spec: the "callbacks" section. Each entry is {"class_name", "config"} with
// Keras's argument names, or a bare class name for the defaults; configs
// are mapped onto the training folder's options structs, and unknown keys
// are rejected with the list of allowed ones.
#include <functional>

#include "kiln/core/error.h"
#include "kiln/core/json_limits.h"
#include "kiln/spec/spec.h"
#include "kiln/training/backup_and_restore.h"
#include "kiln/training/callback.h"
#include "kiln/training/csv_logger.h"
#include "kiln/training/early_stopping.h"
#include "kiln/training/model_checkpoint.h"
#include "kiln/training/reduce_lr_on_plateau.h"
#include "kiln/training/tensorboard.h"

namespace kiln::spec {
namespace {

struct Maker {
  const char* name;
  std::vector<std::string> keys;
  std::function<CallbackPtr(const Json& c, const std::string& where)> make;
};

// "epoch" or a positive number of batches.
SaveFreq save_freq(const Json& c, const char* key) {
  if (!c.contains(key) || c[key].is_null()) return SaveFreq();
  const Json& v = c[key];
  if (v.is_string()) return SaveFreq(v.get<std::string>());
  if (v.is_number_integer()) return SaveFreq(v.get<int64_t>());
  throw ValueError(std::string("`") + key +
                   "` must be \"epoch\" or a positive number of batches. Received: " + json_excerpt(v));
}

std::optional<double> opt_double(const Json& c, const char* key) {
  if (!c.contains(key) || c[key].is_null()) return std::nullopt;
  return get_or<double>(c, key, 0.0);
}

std::string required_path(const Json& c, const char* key, const std::string& where) {
  std::string p = get_or<std::string>(c, key, "");
  if (p.empty()) throw ValueError(where + " needs `" + key + "`, a path");
  return p;
}

const std::vector<Maker>& makers() {
  static const std::vector<Maker> m = {
      {"EarlyStopping",
       {"monitor", "min_delta", "patience", "verbose", "mode", "baseline", "restore_best_weights", "start_from_epoch"},
       [](const Json& c, const std::string&) {
         callbacks::EarlyStoppingOptions o;
         o.monitor = get_or<std::string>(c, "monitor", o.monitor);
         o.min_delta = get_or<double>(c, "min_delta", o.min_delta);
         o.patience = int_or<int>(c, "patience", o.patience, "");
         o.verbose = int_or<int>(c, "verbose", o.verbose, "");
         o.mode = get_or<std::string>(c, "mode", o.mode);
         o.baseline = opt_double(c, "baseline");
         o.restore_best_weights = get_or<bool>(c, "restore_best_weights", o.restore_best_weights);
         o.start_from_epoch = int_or<int>(c, "start_from_epoch", o.start_from_epoch, "");
         return callbacks::EarlyStopping(o);
       }},
      {"ModelCheckpoint",
       {"filepath", "monitor", "verbose", "save_best_only", "save_weights_only", "mode", "save_freq",
        "initial_value_threshold"},
       [](const Json& c, const std::string& where) {
         callbacks::ModelCheckpointOptions o;
         o.monitor = get_or<std::string>(c, "monitor", o.monitor);
         o.verbose = int_or<int>(c, "verbose", o.verbose, "");
         o.save_best_only = get_or<bool>(c, "save_best_only", o.save_best_only);
         o.save_weights_only = get_or<bool>(c, "save_weights_only", o.save_weights_only);
         o.mode = get_or<std::string>(c, "mode", o.mode);
         o.save_freq = save_freq(c, "save_freq");
         o.initial_value_threshold = opt_double(c, "initial_value_threshold");
         return callbacks::ModelCheckpoint(required_path(c, "filepath", where), o);
       }},
      {"BackupAndRestore",
       {"backup_dir", "save_freq", "delete_checkpoint", "keep"},
       [](const Json& c, const std::string& where) {
         callbacks::BackupAndRestoreOptions o;
         o.save_freq = save_freq(c, "save_freq");
         o.delete_checkpoint = get_or<bool>(c, "delete_checkpoint", o.delete_checkpoint);
         o.keep = int_or<int>(c, "keep", o.keep, "");
         return callbacks::BackupAndRestore(required_path(c, "backup_dir", where), o);
       }},
      {"CSVLogger",
       {"filename", "separator", "append"},
       [](const Json& c, const std::string& where) {
         return callbacks::CSVLogger({.filename = required_path(c, "filename", where),
                                      .separator = get_or<std::string>(c, "separator", ","),
                                      .append = get_or<bool>(c, "append", false)});
       }},
      {"TensorBoard",
       {"log_dir", "update_freq"},
       [](const Json& c, const std::string&) {
         callbacks::TensorBoardOptions o;
         o.update_freq = save_freq(c, "update_freq");
         return callbacks::TensorBoard(get_or<std::string>(c, "log_dir", "logs"), o);
       }},
      {"ReduceLROnPlateau",
       {"monitor", "factor", "patience", "verbose", "mode", "min_delta", "cooldown", "min_lr"},
       [](const Json& c, const std::string&) {
         callbacks::ReduceLROnPlateauOptions o;
         o.monitor = get_or<std::string>(c, "monitor", o.monitor);
         o.factor = get_or<double>(c, "factor", o.factor);
         o.patience = int_or<int>(c, "patience", o.patience, "");
         o.verbose = int_or<int>(c, "verbose", o.verbose, "");
         o.mode = get_or<std::string>(c, "mode", o.mode);
         o.min_delta = get_or<double>(c, "min_delta", o.min_delta);
         o.cooldown = int_or<int>(c, "cooldown", o.cooldown, "");
         o.min_lr = get_or<double>(c, "min_lr", o.min_lr);
         return callbacks::ReduceLROnPlateau(o);
       }},
      {"TerminateOnNaN", {}, [](const Json&, const std::string&) { return callbacks::TerminateOnNaN(); }},
  };
  return m;
}

}  // namespace

std::vector<std::string> callback_names() {
  std::vector<std::string> out;
  for (auto& m : makers()) out.push_back(m.name);
  return out;
}

std::vector<CallbackPtr> callbacks_from_spec(const Json& callbacks) {
  std::vector<CallbackPtr> out;
  if (callbacks.is_null()) return out;
  if (!callbacks.is_array())
    throw ValueError("the `callbacks` section must be a list of {\"class_name\", \"config\"} objects. Received: " +
                     json_excerpt(callbacks));
  for (size_t i = 0; i < callbacks.size(); ++i) {
    const std::string where = "callbacks[" + std::to_string(i) + "]";
    Json entry = callbacks[i];
    if (entry.is_string()) entry = Json{{"class_name", entry}};
    if (!entry.is_object() || !entry.contains("class_name") || !entry["class_name"].is_string())
      throw ValueError(
          where + " must be {\"class_name\": \"EarlyStopping\", \"config\": {...}}. Received: " + json_excerpt(entry));
    check_keys(entry, {"class_name", "config"}, where);
    const std::string name = entry["class_name"].get<std::string>();
    const Json config = entry.value("config", Json::object());
    const Maker* maker = nullptr;
    for (auto& m : makers())
      if (name == m.name) maker = &m;
    if (!maker) {
      std::string known;
      for (auto& n : callback_names()) known += (known.empty() ? "" : ", ") + n;
      throw ValueError("unknown callback '" + name + "' in " + where + "; known callbacks: " + known);
    }
    check_keys(config, maker->keys, where + " (" + name + ") config");
    try {
      out.push_back(maker->make(config, where + " (" + name + ")"));
    } catch (const UserError& e) {
      throw ValueError(where + " (" + name + "): " + e.what());
    }
  }
  return out;
}

}  // namespace kiln::spec
