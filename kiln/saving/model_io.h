// The model directory shared by save/load_model, checkpoints, the tuner,
// the server and batch prediction:
//
//   <dir>/model.json            architecture, compile config, dtype policy,
//                               quantization, signatures
//   <dir>/weights.safetensors   every variable, keyed by its path
//   <dir>/optimizer.safetensors optimizer slots and iterations (optional)
//   <dir>/assets/, assets/extra/ (warmup requests; written by other tools)
//
// The directory appears only when complete (AtomicDirectory). A writer
// killed mid-save leaves its staging copy under a hidden name that carries
// its owner (".3.tmp-<host>-<pid>-<hex>"); the next save into the same
// parent directory removes such leftovers once their owner is gone
// (remove_stale_staging). Model::save,
// Model::save_weights/load_weights and load_model (declared in
// kiln/models/model.h) are implemented in model_io.cc.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "kiln/core/json.h"
#include "kiln/models/model.h"
#include "kiln/saving/safetensors.h"

namespace kiln {

constexpr int kModelFormatVersion = 1;

// Signatures as `kiln show` and the server see them:
// {"serving_default": {"inputs": {name: {"dtype", "shape"}}, "outputs": {...},
//  "method_name": "predict"}}
Json model_signatures(models::Model& model);

// model.json of a model directory, validated (FormatError names what is missing).
Json read_model_json(const std::string& dir);

// Removes, from directory `dir`, what killed writers left there: staging
// directories and files (".<name>.tmp-<host>-<pid>-<hex>", as AtomicDirectory,
// atomic_write_file and staging_path name them) and moved-aside old
// versions ("<name>.old-<host>-<pid>-<hex>") whose owner process is dead.
// Kept: anything of a live process (a concurrent writer), of another host
// (a shared file system), or without an owner in its name. Returns the
// removed paths. Model::save calls it on its parent directory.
std::vector<std::string> remove_stale_staging(const std::string& dir);
// A fresh staging path in `dir` for `what`, owned by this process
// (".<what>.tmp-<host>-<pid>-<hex>"), for writers that stage by hand and
// rename into place (kiln train's publish).
std::string staging_path(const std::string& dir, const std::string& what);

// Model directories that are not one kiln Model (an Ensemble, gradient-
// boosted trees) load through a loader that a higher folder registers for
// model.json's class_name (kiln/ensemble registers "Ensemble" and
// "GradientBoostedTrees"), so load_model(), and with it `kiln show`,
// `predict`, `batch-predict` and the server, take them like any model.
// Such a model.json needs no "weights" key. Registering a class_name twice
// replaces the loader. Thread safety: register during static
// initialization only.
using ModelDirectoryLoader = std::function<ModelPtr(const std::string& dir)>;
bool register_model_directory_loader(const std::string& class_name, ModelDirectoryLoader loader);

// Variables keyed by path, in model order, as this process holds them (a
// shard of each sharded variable under ModelParallel). Error on duplicate
// paths.
NamedTensors named_weights(const models::Model& model);
// Assigns by path; FormatError names missing/extra/mismatched entries. A
// sharded variable (ModelParallel) takes its part of a whole tensor, so a
// file saved from any mesh (or none) loads into any other.
void assign_named_weights(models::Model& model, const NamedTensors& tensors, const std::string& what);

// --- Sharded variables (ModelParallel) ------------------------------------
bool has_sharded_variables(const models::Model& model);
// What model files hold: the weights and, with `include_optimizer` (and an
// optimizer), the optimizer's state, whole: sharded variables and their
// optimizer slots gathered from their shards. With sharded variables this
// is a collective: every process calls it at the same point (Model::save
// and save_weights do, and only process 0 then writes); the other
// processes get no sharded entries (they drop each gathered variable at
// once, so no process holds more than one whole variable beyond its
// shards, except process 0, which writes them).
struct SavedState {
  NamedTensors weights, optimizer;
};
SavedState gather_saved_state(const models::Model& model, bool include_optimizer);
// The part of a saved (whole) optimizer state this process holds: the
// slots of sharded variables cut like their variable.
std::map<std::string, at::Tensor> local_optimizer_state(const models::Model& model,
                                                        std::map<std::string, at::Tensor> state);

}  // namespace kiln
