#include "kiln/saving/model_io.h"

#include <signal.h>
#include <unistd.h>
#include <cstdio>
#include <iostream>

#include <cctype>
#include <cerrno>
#include <map>
#include <random>
#include <set>

#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/models/model_json.h"
#include "kiln/models/model_trainer.h"

namespace kiln {
namespace {

// This host's name as temporary names carry it (kiln/core/io.cc,
// random_suffix: letters and digits only, at most 32).
std::string host_tag() {
  char host[256] = {0};
  std::string h;
  if (::gethostname(host, sizeof host - 1) == 0)
    for (const char* p = host; *p && h.size() < 32; ++p)
      if (std::isalnum((unsigned char)*p)) h += *p;
  return h.empty() ? "host" : h;
}

bool all_of_class(const std::string& s, const char* chars) {
  return !s.empty() && s.find_first_not_of(chars) == std::string::npos;
}

// The owner pid of a temporary name ("...<marker><host>-<pid>-<hex>") when
// it belongs to this host; -1 otherwise.
pid_t owner_on_this_host(const std::string& name, const std::string& marker) {
  const size_t at = name.rfind(marker);
  if (at == std::string::npos) return -1;
  const std::string tag = name.substr(at + marker.size());
  const size_t d2 = tag.rfind('-');
  if (d2 == std::string::npos || d2 == 0) return -1;
  const size_t d1 = tag.rfind('-', d2 - 1);
  if (d1 == std::string::npos) return -1;
  const std::string host = tag.substr(0, d1), pid = tag.substr(d1 + 1, d2 - d1 - 1), hex = tag.substr(d2 + 1);
  if (host != host_tag() || !all_of_class(pid, "0123456789") || pid.size() > 9 ||
      !all_of_class(hex, "0123456789abcdef"))
    return -1;
  return (pid_t)std::stol(pid);
}

bool process_alive(pid_t pid) {
  if (pid <= 0) return true;  // not a real owner: never treat as dead
  if (pid == ::getpid()) return true;
  return ::kill(pid, 0) == 0 || errno == EPERM;
}

Json shape_json(const Shape& s) {
  Json j = Json::array();
  for (auto d : s) j.push_back(d < 0 ? Json(nullptr) : Json(d));
  return j;
}

// `stored` as dtype `want`; FormatError naming `what`, `name`, both dtypes
// and a value that the conversion would change.
at::Tensor stored_as_dtype(const at::Tensor& stored, at::ScalarType want, const std::string& what,
                           const std::string& name) {
  if (stored.scalar_type() == want) return stored;
  at::Tensor converted = stored.to(want);
  at::Tensor back = converted.to(stored.scalar_type());
  at::Tensor same = back.eq(stored);
  if (at::isFloatingType(stored.scalar_type())) same = same.logical_or(back.isnan().logical_and(stored.isnan()));
  if (!same.all().item<bool>()) {
    const int64_t i = same.logical_not().reshape({-1}).nonzero()[0][0].item<int64_t>();
    char values[96];
    std::snprintf(values, sizeof values, "%.17g becomes %.17g", stored.reshape({-1})[i].item<double>(),
                  back.reshape({-1})[i].item<double>());
    throw FormatError(what + ": tensor '" + name + "' is stored as " + dtype_to_string(stored.scalar_type()) +
                      " but the model's variable is " + dtype_to_string(want) +
                      ", and the conversion would change its values (" + values + "); store it as " +
                      dtype_to_string(want));
  }
  return converted;
}

}  // namespace

std::vector<std::string> remove_stale_staging(const std::string& dir) {
  std::vector<std::string> removed;
  if (!is_directory(dir)) return removed;
  for (const std::string& name : list_directory(dir)) {
    pid_t owner = -1;
    if (!name.empty() && name[0] == '.') owner = owner_on_this_host(name, ".tmp-");
    if (owner < 0) owner = owner_on_this_host(name, ".old-");
    if (owner < 0 || process_alive(owner)) continue;
    const std::string path = join_path(dir, name);
    remove_all(path);
    if (!path_exists(path)) removed.push_back(path);
  }
  return removed;
}

std::string staging_path(const std::string& dir, const std::string& what) {
  static thread_local std::mt19937_64 rng(std::random_device{}() ^ (uint64_t)::getpid() << 32);
  const char* hex = "0123456789abcdef";
  std::string s(8, '0');
  for (auto& c : s) c = hex[rng() & 15];
  return join_path(dir, "." + what + ".tmp-" + host_tag() + "-" + std::to_string(::getpid()) + "-" + s);
}

NamedTensors named_weights(const models::Model& model) {
  NamedTensors out;
  std::set<std::string> seen;
  for (auto& v : model.weights()) {
    if (!seen.insert(v->path()).second)
      throw Error("model '" + model.name() + "' has two variables with path '" + v->path() +
                  "'; give the layers unique names");
    out.emplace_back(v->path(), v->value().detach());
  }
  return out;
}

bool has_sharded_variables(const models::Model& model) {
  for (auto& v : model.weights())
    if (v->sharded()) return true;
  return false;
}

namespace {

// The variable whose path prefixes optimizer slot `key` ("<path>/<slot>").
const Variable* slot_owner(const std::map<std::string, const Variable*>& by_path, const std::string& key) {
  for (auto slash = key.rfind('/'); slash != std::string::npos && slash > 0; slash = key.rfind('/', slash - 1)) {
    auto it = by_path.find(key.substr(0, slash));
    if (it != by_path.end()) return it->second;
  }
  return nullptr;
}

std::map<std::string, const Variable*> sharded_by_path(const models::Model& model) {
  std::map<std::string, const Variable*> out;
  for (auto& v : model.weights())
    if (v->sharded()) out[v->path()] = v.get();
  return out;
}

// A whole tensor for sharded `v`: this process's part of it.
at::Tensor local_part(const Variable& v, const at::Tensor& t) {
  if (!v.sharded() || !t.sizes().equals(v.global_shape())) return t;
  auto d = distribution();
  if (!d) throw StateError("variable '" + v.path() + "' is sharded but no distribution is set");
  return d->distribute_variable(t, v.layout());
}

}  // namespace

SavedState gather_saved_state(const models::Model& model, bool include_optimizer) {
  SavedState s;
  auto dist = distribution();
  std::set<std::string> seen;
  for (auto& v : model.weights()) {
    if (!seen.insert(v->path()).second)
      throw Error("model '" + model.name() + "' has two variables with path '" + v->path() +
                  "'; give the layers unique names");
    if (!v->sharded()) {
      s.weights.emplace_back(v->path(), v->value().detach());
      continue;
    }
    at::Tensor whole = dist->gather_variable(*v);  // one variable at a time: the transient copy stays small
    if (is_chief()) s.weights.emplace_back(v->path(), std::move(whole));
  }
  if (!include_optimizer || !model.compiled() || !model.compile_args().optimizer) return s;
  const auto sharded = sharded_by_path(model);
  for (auto& [k, t] : model.compile_args().optimizer->state_dict()) {
    const Variable* v = sharded.empty() ? nullptr : slot_owner(sharded, k);
    if (v && t.sizes().equals(v->value().sizes())) {  // a slot shaped like its variable: sharded like it
      Variable slot(k, t, false, v->layout(), v->global_shape());
      at::Tensor whole = dist->gather_variable(slot);
      if (is_chief()) s.optimizer.emplace_back(k, std::move(whole));
    } else {
      s.optimizer.emplace_back(k, t);
    }
  }
  return s;
}

std::map<std::string, at::Tensor> local_optimizer_state(const models::Model& model,
                                                        std::map<std::string, at::Tensor> state) {
  const auto sharded = sharded_by_path(model);
  if (sharded.empty()) return state;
  for (auto& [k, t] : state)
    if (const Variable* v = slot_owner(sharded, k)) t = local_part(*v, t);
  return state;
}

namespace {

// "two_heads/dense_3/kernel" -> "two_heads/dense/kernel": a path without
// the counters that auto-naming appends.
std::string without_name_counters(const std::string& path) {
  std::string out;
  size_t start = 0;
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    std::string part = path.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    size_t us = part.rfind('_');
    if (us != std::string::npos && us + 1 < part.size() &&
        part.find_first_not_of("0123456789", us + 1) == std::string::npos)
      part.resize(us);
    out += (out.empty() ? "" : "/") + part;
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  return out;
}

// A subclassed model's sublayers get fresh auto-names when it is rebuilt
// from its config (dense_3 where the saved one had dense), so its paths
// differ only in those counters: match such tensors by position (the order
// they were saved in), as Keras matches weights by tracking order.
bool assign_by_position(const std::vector<VariablePtr>& vars, const NamedTensors& tensors, const std::string& what,
                        std::map<std::string, int>* converted) {
  if (vars.size() != tensors.size()) return false;
  for (size_t i = 0; i < vars.size(); ++i)
    if (without_name_counters(vars[i]->path()) != without_name_counters(tensors[i].first) ||
        !local_part(*vars[i], tensors[i].second).sizes().equals(vars[i]->value().sizes()))
      return false;
  for (size_t i = 0; i < vars.size(); ++i) {
    if (tensors[i].second.scalar_type() != vars[i]->dtype())
      ++(*converted)[dtype_to_string(tensors[i].second.scalar_type()) + " to " + dtype_to_string(vars[i]->dtype())];
    vars[i]->assign(stored_as_dtype(local_part(*vars[i], tensors[i].second), vars[i]->dtype(), what, tensors[i].first));
  }
  return true;
}

}  // namespace

void assign_named_weights(models::Model& model, const NamedTensors& tensors, const std::string& what) {
  std::map<std::string, at::Tensor> by_name(tensors.begin(), tensors.end());
  auto vars = model.weights();
  bool all_named = true;
  for (auto& v : vars) all_named = all_named && by_name.count(v->path());
  // Weights stored in another dtype than their variable's load only when no
  // value changes (F16 into float32; F64 holding float32 values), and say so.
  std::map<std::string, int> converted;  // "float16 to float32" -> tensors
  auto note = [&] {
    for (auto& [how, n] : converted)
      std::cerr << "kiln: note: " << what << ": converted " << n << " tensor(s) from " << how
                << " without changing any value\n";
  };
  if (!all_named && assign_by_position(vars, tensors, what, &converted)) return note();
  for (auto& v : vars) {
    auto it = by_name.find(v->path());
    if (it == by_name.end())
      throw FormatError(what + " has no tensor for variable '" + v->path() + "' of model '" + model.name() + "'");
    if (!it->second.sizes().equals(v->global_shape()))
      throw FormatError(what + ": tensor '" + v->path() + "' has shape " +
                        shape_to_string(Shape(it->second.sizes().begin(), it->second.sizes().end())) +
                        " but the model expects " + shape_to_string(v->global_shape()));
    if (it->second.scalar_type() != v->dtype())
      ++converted[dtype_to_string(it->second.scalar_type()) + " to " + dtype_to_string(v->dtype())];
    v->assign(stored_as_dtype(local_part(*v, it->second), v->dtype(), what, v->path()));
    by_name.erase(it);
  }
  if (!by_name.empty())
    throw FormatError(what + " has " + std::to_string(by_name.size()) + " tensor(s) the model does not, e.g. '" +
                      by_name.begin()->first + "'");
  note();
}

Json model_signatures(models::Model& model) {
  Json inputs = Json::object(), outputs = Json::object();
  auto shapes = model.input_shapes();
  auto dtypes = model.input_dtypes();
  auto names = model.input_names();
  for (size_t i = 0; i < shapes.size(); ++i)
    inputs[i < names.size() ? names[i] : "inputs_" + std::to_string(i)] =
        Json{{"dtype", dtype_to_string(i < dtypes.size() ? dtypes[i] : at::kFloat)}, {"shape", shape_json(shapes[i])}};
  if (!shapes.empty()) {
    auto out_shapes = model.output_shapes();
    auto out_names = model.output_names();
    for (size_t i = 0; i < out_shapes.size(); ++i)
      outputs[i < out_names.size() ? out_names[i] : "output_" + std::to_string(i)] =
          Json{{"dtype", "float32"}, {"shape", shape_json(out_shapes[i])}};
  }
  return Json{{"serving_default", Json{{"inputs", inputs}, {"outputs", outputs}, {"method_name", "predict"}}}};
}

namespace {

// Model's saving members and load_model (kiln/models/model.h) come here
// through the seam of kiln/models/model_trainer.h: this library registers
// Saver when it loads.
class Saver final : public ModelSaver {
 public:
  void save(models::Model& model, const std::string& dir, bool include_optimizer) override;
  void save_weights(models::Model& model, const std::string& path) override;
  void load_weights(models::Model& model, const std::string& path) override;
  ModelPtr load_model(const std::string& dir) override;
};

[[maybe_unused]] const bool saver_registered = register_model_saver(std::make_unique<Saver>());

}  // namespace

void Saver::save(models::Model& model, const std::string& dir, bool include_optimizer) {
  if (model.input_shapes().empty())
    throw StateError("model '" + model.name() + "' is not built; call it, fit it or give it an Input before save()");
  Json mj;
  mj["format"] = "kiln.model";
  mj["format_version"] = kModelFormatVersion;
  Json arch = serialize_layer(model);  // Keras 3's model.to_json() form
  mj["module"] = arch["module"];
  mj["class_name"] = arch["class_name"];
  mj["config"] = arch["config"];
  mj["registered_name"] = arch["registered_name"];
  if (arch.contains("build_config")) mj["build_config"] = arch["build_config"];
  mj["dtype_policy"] = model.dtype_policy().name();
  if (const std::string q = model.quantization_summary(); !q.empty()) mj["quantization"] = q;
  mj["quantization"] = nullptr;
  mj["compile_config"] = model.compiled() ? model.compile_args().to_json() : Json(nullptr);
  mj["signatures"] = model_signatures(model);
  Json params{{"total", model.count_params()}};
  int64_t trainable = 0;
  for (auto& v : model.trainable_weights()) trainable += num_elements(v->global_shape());
  params["trainable"] = trainable;
  params["non_trainable"] = model.count_params() - trainable;
  mj["params"] = params;
  mj["weights"] = "weights.safetensors";
  bool with_opt = include_optimizer && model.compiled() && model.compile_args().optimizer;
  mj["optimizer"] = with_opt ? Json("optimizer.safetensors") : Json(nullptr);

  // ModelParallel: every process gathers, process 0 writes.
  const SavedState state = gather_saved_state(model, with_opt);
  if (has_sharded_variables(model) && !is_chief()) return;
  // Staging copies of earlier saves here that were killed mid-write.
  remove_stale_staging(parent_path(dir));
  AtomicDirectory out(dir);
  save_safetensors(out.path() + "/weights.safetensors", state.weights, {{"format", "kiln"}});
  if (with_opt) save_safetensors(out.path() + "/optimizer.safetensors", state.optimizer, {{"format", "kiln"}});
  make_dirs(out.path() + "/assets");
  atomic_write_file(out.path() + "/model.json", mj.dump(2) + "\n");
  out.commit(/*replace=*/true);
}

void Saver::save_weights(models::Model& model, const std::string& path) {
  if (path.size() < 12 || path.substr(path.size() - 12) != ".safetensors")
    throw ValueError("save_weights: the file name must end in .safetensors. Received: " + path);
  const SavedState state = gather_saved_state(model, false);  // ModelParallel: every process gathers
  if (has_sharded_variables(model) && !is_chief()) return;    // and process 0 writes
  make_dirs(parent_path(path));
  save_safetensors(path, state.weights, {{"format", "kiln"}});
}

void Saver::load_weights(models::Model& model, const std::string& path) {
  assign_named_weights(model, load_safetensors(path), path);
}

namespace {

std::map<std::string, ModelDirectoryLoader>& directory_loaders() {
  static std::map<std::string, ModelDirectoryLoader> loaders;
  return loaders;
}

ModelDirectoryLoader directory_loader(const std::string& class_name) {
  auto it = directory_loaders().find(class_name);
  return it == directory_loaders().end() ? ModelDirectoryLoader() : it->second;
}

}  // namespace

bool register_model_directory_loader(const std::string& class_name, ModelDirectoryLoader loader) {
  directory_loaders()[class_name] = std::move(loader);
  return true;
}

Json read_model_json(const std::string& dir) {
  if (!is_directory(dir)) throw NotFoundError("model directory not found: " + dir);
  const std::string p = dir + "/model.json";
  if (!path_exists(p)) throw NotFoundError(dir + " is not a kiln model directory: model.json is missing");
  Json mj = read_json_file(p);
  if (!mj.is_object() || mj.value("format", "") != "kiln.model")
    throw FormatError(p + " is not a kiln model description (\"format\": \"kiln.model\" missing)");
  if (mj.value("format_version", 0) > kModelFormatVersion)
    throw FormatError(p + " has format_version " + std::to_string(mj.value("format_version", 0)) +
                      "; this kiln reads up to " + std::to_string(kModelFormatVersion) + " (upgrade kiln)");
  for (const char* key : {"class_name", "config"})
    if (!mj.contains(key)) throw FormatError(p + " lacks \"" + std::string(key) + "\"");
  if (!mj.contains("weights") &&
      !(mj["class_name"].is_string() && directory_loader(mj["class_name"].get<std::string>())))
    throw FormatError(p + " lacks \"weights\"");
  return mj;
}

ModelPtr Saver::load_model(const std::string& dir) {
  Json mj = read_model_json(dir);
  if (mj["class_name"].is_string())
    if (auto loader = directory_loader(mj["class_name"].get<std::string>())) return loader(dir);
  Json arch{{"class_name", mj["class_name"]}, {"config", mj["config"]}};
  for (const char* key : {"module", "registered_name", "build_config"})
    if (mj.contains(key)) arch[key] = mj[key];
  LayerPtr layer;
  try {
    layer = layer_from_json(arch);
  } catch (const NotFoundError& e) {
    throw FormatError(dir + "/model.json: " + e.what());
  }
  auto model = std::dynamic_pointer_cast<models::Model>(layer);
  if (!model)
    throw FormatError(dir + "/model.json describes a " + mj["class_name"].get<std::string>() + ", not a model");
  if (model->input_shapes().empty()) throw FormatError(dir + "/model.json has no input shape to build the model with");
  const std::string wpath = dir + "/" + mj["weights"].get<std::string>();
  assign_named_weights(*model, load_safetensors(wpath), wpath);
  if (mj.contains("compile_config") && !mj["compile_config"].is_null()) {
    model->compile(CompileArgs::from_json(mj["compile_config"]));
    if (mj.contains("optimizer") && mj["optimizer"].is_string()) {
      const std::string opath = dir + "/" + mj["optimizer"].get<std::string>();
      std::map<std::string, at::Tensor> state;
      for (auto& [k, v] : load_safetensors(opath)) state[k] = v;
      model->compile_args().optimizer->load_state_dict(local_optimizer_state(*model, std::move(state)));
    }
  }
  return model;
}

}  // namespace kiln
