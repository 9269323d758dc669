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
Json model_signatures(Model& model);

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

// Variables keyed by path, in model order. Error on duplicate paths.
NamedTensors named_weights(const Model& model);
// Assigns by path; FormatError names missing/extra/mismatched entries.
void assign_named_weights(Model& model, const NamedTensors& tensors, const std::string& what);

}  // namespace kiln
