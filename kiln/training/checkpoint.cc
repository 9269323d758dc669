#include "kiln/training/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "kiln/core/base64.h"
#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/core/random.h"
#include "kiln/models/model.h"
#include "kiln/saving/model_io.h"
#include "kiln/saving/safetensors.h"
#include "kiln/training/callback.h"
#include "kiln/training/tfevents.h"

namespace kiln {
namespace {

constexpr const char* kStateFile = "training_state.json";
constexpr const char* kPrefix = "ckpt-";
constexpr const char* kCallbacksFile = "callbacks.safetensors";

// A checkpoint's RNG state, decoded (FormatError naming `what` when corrupt).
std::string rng_state_from_base64(const std::string& in, const std::string& what) {
  try {
    return base64_decode(in);
  } catch (const ValueError& e) {
    throw FormatError(what + ": " + e.what());
  }
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

bool is_checkpoint_name(const std::string& name) {
  if (name.rfind(kPrefix, 0) != 0 || name.size() == std::strlen(kPrefix)) return false;
  return std::all_of(name.begin() + std::strlen(kPrefix), name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

int64_t sequence_of(const std::string& name) { return std::stoll(name.substr(std::strlen(kPrefix))); }

std::string metric_key(size_t metric_index, const std::string& metric_name, size_t var_index) {
  return "metrics/" + std::to_string(metric_index) + "/" + metric_name + "/" + std::to_string(var_index);
}

// A fully read and verified checkpoint, not yet applied to a model.
struct LoadedCheckpoint {
  ResumePoint point;
  NamedTensors weights;
  std::map<std::string, at::Tensor> optimizer;
  NamedTensors metrics;
};

LoadedCheckpoint load_verified(const std::string& dir) {
  const std::string state_path = join_path(dir, kStateFile);
  Json st = parse_json(read_file(state_path), state_path);
  if (!st.is_object() || st.value("format", "") != "kiln.training_state")
    throw FormatError(state_path + " is not a kiln training state (\"format\": \"kiln.training_state\" missing)");
  if (st.value("format_version", 0) != 1)
    throw FormatError(state_path + " has an unsupported format_version " + st.value("format_version", Json(0)).dump());
  for (const char* key : {"epoch", "batch", "host_rng", "host_rng_epoch_start", "torch_rng", "files"})
    if (!st.contains(key)) throw FormatError(state_path + " lacks \"" + std::string(key) + "\"");
  LoadedCheckpoint out;
  std::map<std::string, std::string> bytes;
  for (auto& [name, info] : st["files"].items()) {
    const std::string p = join_path(dir, name);
    std::string data = read_file(p);
    const int64_t want_size = info.value("bytes", (int64_t)-1);
    if ((int64_t)data.size() != want_size)
      throw FormatError(p + " is " + std::to_string(data.size()) + " bytes; the checkpoint recorded " +
                        std::to_string(want_size) + " (truncated or overwritten)");
    const std::string crc = hex32(crc32c(data.data(), data.size()));
    if (crc != info.value("crc32c", ""))
      throw FormatError(p + " fails its CRC-32C check (" + crc + ", recorded " + info.value("crc32c", "") +
                        "): the file is corrupt");
    bytes[name] = std::move(data);
  }
  for (const char* f : {"weights.safetensors", "optimizer.safetensors", "metrics.safetensors"})
    if (!bytes.count(f)) throw FormatError(state_path + " does not list " + std::string(f));
  out.weights = decode_safetensors(bytes["weights.safetensors"], join_path(dir, "weights.safetensors"));
  for (auto& [k, v] : decode_safetensors(bytes["optimizer.safetensors"], join_path(dir, "optimizer.safetensors")))
    out.optimizer[k] = v;
  out.metrics = decode_safetensors(bytes["metrics.safetensors"], join_path(dir, "metrics.safetensors"));
  if (bytes.count(kCallbacksFile))  // absent in checkpoints of older kiln versions
    for (auto& [k, v] : decode_safetensors(bytes[kCallbacksFile], join_path(dir, kCallbacksFile)))
      out.point.callback_tensors[k] = v;

  ResumePoint& p = out.point;
  p.epoch = st["epoch"].get<int>();
  p.batch = st["batch"].get<int64_t>();
  if (p.epoch < 0 || p.batch < 0) throw FormatError(state_path + " has a negative epoch or batch");
  p.host_rng = st["host_rng"].get<std::string>();
  p.host_rng_epoch_start = st["host_rng_epoch_start"].get<std::string>();
  p.stop_training = st.value("stop_training", false);
  if (st.contains("callbacks")) {
    if (!st["callbacks"].is_object()) throw FormatError(state_path + ": \"callbacks\" must be an object");
    p.callback_states = st["callbacks"];
  }
  std::string gen = rng_state_from_base64(st["torch_rng"].get<std::string>(), state_path + " torch_rng");
  p.torch_rng = at::empty({(int64_t)gen.size()}, at::kByte);
  std::memcpy(p.torch_rng.data_ptr(), gen.data(), gen.size());
  if (st.contains("cuda_rng")) {  // trained on a GPU
    std::string cuda = rng_state_from_base64(st["cuda_rng"].get<std::string>(), state_path + " cuda_rng");
    p.cuda_rng = at::empty({(int64_t)cuda.size()}, at::kByte);
    std::memcpy(p.cuda_rng.data_ptr(), cuda.data(), cuda.size());
  }
  // Check the RNG texts parse now rather than half-way through a restore.
  std::mt19937_64 probe;
  for (const std::string* s : {&p.host_rng, &p.host_rng_epoch_start}) {
    std::istringstream is(*s);
    is >> probe;
    if (is.fail()) throw FormatError(state_path + ": unreadable host RNG state");
  }
  return out;
}

}  // namespace

std::string host_rng_state() {
  std::ostringstream os;
  os << host_rng();
  return os.str();
}

void set_host_rng_state(const std::string& state) {
  std::istringstream is(state);
  std::mt19937_64 rng;
  is >> rng;
  if (is.fail()) throw FormatError("unreadable host RNG state");
  host_rng() = rng;
}

at::Tensor torch_rng_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state().clone();
}

void set_torch_rng_state(const at::Tensor& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

at::Tensor cuda_rng_state(const at::Device& device) {
  if (!device.is_cuda()) return {};
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state().clone();
}

void set_cuda_rng_state(const at::Device& device, const at::Tensor& state) {
  if (!device.is_cuda() || !state.defined()) return;
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

std::vector<std::string> list_training_checkpoints(const std::string& backup_dir) {
  std::vector<std::string> names;
  if (!is_directory(backup_dir)) return names;
  for (auto& n : list_directory(backup_dir))
    if (is_checkpoint_name(n) && is_directory(join_path(backup_dir, n))) names.push_back(n);
  std::sort(names.begin(), names.end(),
            [](const std::string& a, const std::string& b) { return sequence_of(a) < sequence_of(b); });
  std::vector<std::string> out;
  for (auto& n : names) out.push_back(join_path(backup_dir, n));
  return out;
}

std::string write_training_checkpoint(const std::string& backup_dir, models::Model& model, const ResumePoint& point,
                                      int keep) {
  // ModelParallel: every process gathers the shards, process 0 writes.
  SavedState state = gather_saved_state(model, /*include_optimizer=*/true);
  if (!is_chief()) return "";
  make_dirs(backup_dir);
  // Leftovers of a crash mid-write (temporary names start with a dot).
  for (auto& n : list_directory(backup_dir))
    if (n.rfind(std::string(".") + kPrefix, 0) == 0) remove_all(join_path(backup_dir, n));
  auto existing = list_training_checkpoints(backup_dir);
  int64_t seq = existing.empty() ? 1 : sequence_of(existing.back().substr(existing.back().rfind('/') + 1)) + 1;
  char name[32];
  std::snprintf(name, sizeof name, "%s%012lld", kPrefix, (long long)seq);

  std::map<std::string, std::string> files;
  const std::map<std::string, std::string> meta{{"format", "kiln"}};
  files["weights.safetensors"] = encode_safetensors(state.weights, meta);
  files["optimizer.safetensors"] = encode_safetensors(state.optimizer, meta);
  NamedTensors metrics;
  auto all = model.train_state().all_metrics();
  for (size_t i = 0; i < point.metric_variables.size() && i < all.size(); ++i)
    for (size_t j = 0; j < point.metric_variables[i].size(); ++j)
      metrics.emplace_back(metric_key(i, all[i]->name(), j), point.metric_variables[i][j]);
  files["metrics.safetensors"] = encode_safetensors(metrics, meta);
  NamedTensors cb_tensors(point.callback_tensors.begin(), point.callback_tensors.end());
  files[kCallbacksFile] = encode_safetensors(cb_tensors, meta);

  Json st;
  st["format"] = "kiln.training_state";
  st["format_version"] = 1;
  st["epoch"] = point.epoch;
  st["batch"] = point.batch;
  st["iterations"] = model.train_state().optimizer().iterations();
  st["data_position"] = Json{{"epoch", point.epoch}, {"batches_done", point.batch}};
  st["host_rng"] = point.host_rng;
  st["host_rng_epoch_start"] = point.host_rng_epoch_start;
  at::Tensor gen = point.torch_rng.contiguous().to(at::kByte);
  st["torch_rng"] = base64_encode(std::string((const char*)gen.data_ptr(), gen.numel()));
  if (point.cuda_rng.defined()) {
    at::Tensor cuda = point.cuda_rng.contiguous().to(at::kByte);
    st["cuda_rng"] = base64_encode(std::string((const char*)cuda.data_ptr(), cuda.numel()));
  }
  st["stop_training"] = point.stop_training;
  st["callbacks"] = point.callback_states;
  Json fj = Json::object();
  for (auto& [n, data] : files)
    fj[n] = Json{{"bytes", data.size()}, {"crc32c", hex32(crc32c(data.data(), data.size()))}};
  st["files"] = fj;

  const std::string target = join_path(backup_dir, name);
  {
    AtomicDirectory out(target);
    for (auto& [n, data] : files) atomic_write_file(join_path(out.path(), n), data);
    atomic_write_file(join_path(out.path(), kStateFile), st.dump(1) + "\n");
    out.commit(/*replace=*/false);
  }
  auto all_ckpts = list_training_checkpoints(backup_dir);
  for (size_t i = 0; i + keep < all_ckpts.size(); ++i) remove_all(all_ckpts[i]);
  return target;
}

std::optional<ResumePoint> restore_training_checkpoint(const std::string& backup_dir, models::Model& model) {
  auto ckpts = list_training_checkpoints(backup_dir);
  if (ckpts.empty()) return std::nullopt;
  std::string errors;
  for (auto it = ckpts.rbegin(); it != ckpts.rend(); ++it) {
    LoadedCheckpoint c;
    try {
      c = load_verified(*it);
    } catch (const UserError& e) {  // NotFoundError (a missing file) or FormatError
      warn(std::string("ignoring checkpoint ") + *it + ": " + e.what());
      errors += std::string(errors.empty() ? "" : "; ") + e.what();
      continue;
    }
    // Verified: apply. A mismatch with the model here is the caller's error
    // (another model's checkpoint), not corruption, so it propagates.
    assign_named_weights(model, c.weights, join_path(*it, "weights.safetensors"));
    model.train_state().optimizer().load_state_dict(local_optimizer_state(model, c.optimizer));
    auto all = model.train_state().all_metrics();
    std::map<std::string, at::Tensor> by_key(c.metrics.begin(), c.metrics.end());
    if (!by_key.empty()) {
      for (size_t i = 0; i < all.size(); ++i) {
        Tensors vars;
        for (size_t j = 0;; ++j) {
          auto f = by_key.find(metric_key(i, all[i]->name(), j));
          if (f == by_key.end()) break;
          vars.push_back(f->second);
        }
        c.point.metric_variables.push_back(vars);
      }
    }
    return c.point;
  }
  throw FormatError("no valid checkpoint in " + backup_dir + " (" + errors +
                    "); delete the directory to start training from scratch");
}

}  // namespace kiln
