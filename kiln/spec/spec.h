// The declarative training spec read by `kiln train` (format: docs/SPEC.md),
// as a library (kiln::spec) so a C++ program can train from a spec too:
//   auto spec = read_spec("spec.json");
//   auto data = load_data(spec["data"]);
//   auto model = build_model(spec["model"], std::nullopt);
//
//   {
//     "model":     {"builtin": "mlp", "args": {"hidden_units": [256, 256]}},
//     "data":      {"source": "fashion_mnist", "scale": "1/255", "flatten": true},
//     "compile":   {"optimizer": "adam", "loss": "sparse_categorical_crossentropy",
//                   "metrics": ["accuracy"]},
//     "fit":       {"epochs": 10, "batch_size": 128, "validation_split": 0.1, "seed": 1},
//     "callbacks": [{"class_name": "EarlyStopping", "config": {"patience": 2}}],
//     "output":    {"base_dir": "models/fashion_mnist"}
//   }
//
// Every section is checked strictly: an unknown key is a ValueError naming
// the key, where it was found and the keys allowed there (a typo must not be
// silently ignored). Relative paths are relative to the working directory.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/core/json.h"
#include "kiln/models/fit_args.h"
#include "kiln/models/model.h"

namespace kiln::spec {

// ValueError if `j` is not an object or has a key outside `allowed`.
void check_keys(const Json& j, const std::vector<std::string>& allowed, const std::string& where);

// The integer at `key` of `j` (`fallback` when absent or null), for T an
// integer type. A number with a fraction, beyond T's range (`1e308`) or not
// a number is a ValueError naming `section.key` (`key` when `section` is
// empty) and the value, never a wrapped-around integer. 3.0 reads as 3.
template <class T>
T int_or(const Json& j, const char* key, T fallback, const std::string& section);
int64_t int_or(const Json& j, const char* key, int64_t fallback, const std::string& section, int64_t lo, int64_t hi);

// A spec file, its top-level keys validated; a key given twice in one object
// is a ValueError (nlohmann's parser would keep the last one silently).
Json read_spec(const std::string& path);
// The same from the spec's text; `what` names it in errors.
Json parse_spec(const std::string& text, const std::string& what);

// --- data ("data" section) ---------------------------------------------------
struct DataSplits {
  std::string description;  // "fashion_mnist", "csv iris.csv", ...
  at::Tensor x_train, y_train;
  at::Tensor x_test, y_test;  // undefined when the source has no test split
  bool has_test() const { return x_test.defined(); }
  // Named inputs and outputs (csv `inputs` / `outputs`): one tensor per
  // name, in the spec's order (x_*/y_* then hold the first of each).
  std::vector<std::string> input_names, output_names;
  std::vector<at::Tensor> xs_train, ys_train, xs_test, ys_test;
  bool text = false;  // x_* are string tensors (kiln/core/string_tensor.h)
};
// Reads the data and applies limit / test_split / scale / flatten / reshape / dtype.
DataSplits load_data(const Json& data);
// The tensors for `model`'s inputs and outputs, in its order: named data
// is matched by the model's input and output names (a single input or
// output may have any name); ValueError naming what is missing.
void model_data(const DataSplits& data, const models::Model& model, bool test, std::vector<at::Tensor>* x,
                std::vector<at::Tensor>* y);

// --- model ("model" section) -------------------------------------------------
// `input_shape` (without the batch dimension) is used when the spec gives
// none (e.g. taken from the data).
ModelPtr build_model(const Json& model, const std::optional<Shape>& input_shape);
// `model.adapt` (optional): names of preprocessing layers in `model`
// (TextVectorization, StringLookup, IntegerLookup, Normalization) that learn
// their vocabulary or statistics from `x_train` before training, in order,
// as Keras's layer.adapt(x). The model is then rebuilt from its config, so
// shapes that follow the vocabulary (multi_hot depth) are right; the
// adapted state is part of the configs, hence of the saved model.json.
// Returns `model` unchanged when there is nothing to adapt.
ModelPtr adapt_model(const Json& model_section, ModelPtr model, const at::Tensor& x_train);
// Named architectures: "mlp", "cnn".
ModelPtr builtin_model(const std::string& name, const Json& args, const std::optional<Shape>& input_shape);
std::vector<std::string> builtin_model_names();

// --- compile / fit / callbacks -----------------------------------------------
// Defaults when absent: adam, sparse_categorical_crossentropy, ["accuracy"].
CompileArgs compile_args_from_spec(const Json& compile);
// Fills epochs, batch_size, validation_split, ... ; `seed` gets fit.seed.
FitArgs fit_args_from_spec(const Json& fit, std::optional<uint64_t>* seed);
// [{"class_name": "EarlyStopping", "config": {...}}, "TerminateOnNaN", ...]
std::vector<CallbackPtr> callbacks_from_spec(const Json& callbacks);
std::vector<std::string> callback_names();

template <class T>
T int_or(const Json& j, const char* key, T fallback, const std::string& section) {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool> && sizeof(T) <= sizeof(int64_t));
  return static_cast<T>(int_or(j, key, static_cast<int64_t>(fallback), section,
                               static_cast<int64_t>(std::numeric_limits<T>::min()),
                               static_cast<int64_t>(std::min<uint64_t>(std::numeric_limits<T>::max(), INT64_MAX))));
}

}  // namespace kiln::spec
