#include "kiln/serving/core/servable.h"

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <spdlog/spdlog.h>

#include <mutex>
#include <optional>
#include <sstream>

#include "kiln/core/dtype.h"
#include "kiln/core/registry.h"
#include "kiln/core/string_tensor.h"
#include "kiln/core/threads.h"
#include "kiln/models/model.h"
#include "kiln/saving/model_io.h"
#include "kiln/serving/status.h"

namespace kiln::serving {
namespace {

using ServableRegistry = Registry<std::unique_ptr<Servable>, const std::string&>;

ServableRegistry& registry() {
  static auto* r = new ServableRegistry(  // never destroyed
      "platform", {{"kiln", [](const std::string& dir) { return std::make_unique<ModelServable>(dir); }}});
  return *r;
}

std::string shape_str(at::IntArrayRef s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << "]";
  return o.str();
}

// The layer and everything below it are built (no lazy build left to race).
bool fully_built(const Layer& layer) {
  if (!layer.built()) return false;
  for (auto& s : layer.sublayers())
    if (!fully_built(*s)) return false;
  return true;
}

}  // namespace

bool is_string_spec(const Json& spec) {
  return spec.is_object() && spec.contains("dtype") && spec["dtype"] == dtype_to_string(kStringDType);
}

const Json& signature_input_spec(const Json& signatures, const std::string& signature, const std::string& name) {
  static const Json kNull;
  if (!signatures.is_object() || !signatures.contains(signature)) return kNull;
  const Json& sig = signatures[signature];
  if (!sig.contains("inputs") || !sig["inputs"].contains(name)) return kNull;
  return sig["inputs"][name];
}

StringTensorNames string_tensor_names(const Json& signatures, const std::string& signature) {
  StringTensorNames names;
  if (!signatures.is_object() || !signatures.contains(signature)) return names;
  const Json& sig = signatures[signature];
  for (auto [side, out] : {std::pair{"inputs", &names.inputs}, std::pair{"outputs", &names.outputs}})
    if (sig.contains(side))
      for (auto& [name, spec] : sig[side].items())
        if (is_string_spec(spec)) out->insert(name);
  return names;
}

void register_servable_factory(const std::string& platform, ServableFactory factory) {
  registry().add(platform, std::move(factory));
}

bool has_servable_platform(const std::string& platform) { return registry().contains(platform); }

std::unique_ptr<Servable> make_servable(const std::string& platform, const std::string& dir) {
  ServableFactory f = registry().find(platform);
  if (!f) {
    throw ServingError(Code::kInvalidArgument,
                       "unknown model_platform \"" + platform + "\"; known platforms: " + registry().joined_names());
  }
  return f(dir);
}

ModelServable::ModelServable(const std::string& dir) {
  model_ = load_model(dir);
  signatures_ = model_signatures(*model_);
  input_names_ = model_->input_names();
  output_names_ = model_->output_names();
  const Json& sig = signatures_[kDefaultSignature];
  if (input_names_.size() != sig["inputs"].size()) {
    input_names_.clear();
    for (auto& [k, v] : sig["inputs"].items()) input_names_.push_back(k);
  }
  output_names_.clear();
  for (auto& [k, v] : sig["outputs"].items()) output_names_.push_back(k);
  bool first = true;
  for (auto& [name, t] : named_weights(*model_)) {
    if (first) device_ = t.device();  // load_model puts every variable on the default device
    first = false;
    memory_bytes_ += (int64_t)t.nbytes();
    weight_count_ += t.numel();
    if (t.device() == device_) device_memory_bytes_ += (int64_t)t.nbytes();
  }
  built_ = fully_built(*model_);
  if (!device_.is_cpu()) {
    // The device-generic c10 interface (as kiln/training/device_prefetch.cc):
    // no CUDA headers, so this builds against a CPU-only LibTorch too.
    const c10::impl::VirtualGuardImpl impl(device_.type());
    // The weights were written on the loading thread's current stream; this
    // version's stream must not read them before that work is done.
    impl.getStream(device_).synchronize();
    stream_ = impl.getStreamFromGlobalPool(device_, /*isHighPriority=*/false);
  }
}

ModelServable::~ModelServable() {
  // A call that threw may have left work on the stream that reads the
  // weights; they must outlive it (the caching allocator would hand their
  // blocks to the next allocation on the weights' own stream at once).
  if (stream_) {
    try {
      stream_->synchronize();
    } catch (const std::exception& e) {
      spdlog::error("serving: waiting for a model's stream at unload failed: {}", e.what());
    }
  }
}

TensorMap ModelServable::predict(const TensorMap& inputs, const std::string& signature) {
  const std::string& sig_name = signature.empty() ? std::string(kDefaultSignature) : signature;
  if (!signatures_.contains(sig_name)) {
    std::string known;
    for (auto& [k, v] : signatures_.items()) known += (known.empty() ? "" : ", ") + k;
    throw ServingError(Code::kInvalidArgument,
                       "Serving signature name: \"" + sig_name + "\" not found in signature def. Known: " + known);
  }
  const Json& sig = signatures_[sig_name];
  Tensors xs;
  int64_t batch = -1;
  for (auto& name : input_names_) {
    auto it = inputs.find(name);
    if (it == inputs.end())
      throw ServingError(Code::kInvalidArgument, "missing input '" + name + "' of signature " + sig_name);
    const at::Tensor& t = it->second;
    const Json& spec = sig["inputs"][name];
    auto want_dtype = dtype_from_string(spec["dtype"].get<std::string>());
    // A string input holds a string tensor: uint8 with the row width last.
    const bool is_string = is_string_dtype(want_dtype);
    if (is_string ? (t.scalar_type() != string_storage_dtype || t.dim() == 0) : t.scalar_type() != want_dtype)
      throw ServingError(Code::kInvalidArgument, "input '" + name + "' expects dtype " +
                                                     spec["dtype"].get<std::string>() +
                                                     ". Received: " + dtype_to_string(t.scalar_type()));
    const at::IntArrayRef sizes = is_string ? t.sizes().slice(0, t.dim() - 1) : t.sizes();
    const Json& shape = spec["shape"];
    bool ok = shape.size() == sizes.size();
    for (size_t d = 0; ok && d < shape.size(); ++d)
      if (!shape[d].is_null() && shape[d].get<int64_t>() >= 0 && shape[d].get<int64_t>() != sizes[d]) ok = false;
    if (!ok)
      throw ServingError(Code::kInvalidArgument, "input '" + name + "' expects shape " + shape.dump() +
                                                     " (null: any size). Received: " + shape_str(sizes));
    if (batch >= 0 && !sizes.empty() && sizes[0] != batch)
      throw ServingError(Code::kInvalidArgument, "inputs disagree on the batch size (dim 0): " + std::to_string(batch) +
                                                     " vs " + std::to_string(sizes[0]) + " for '" + name + "'");
    if (!sizes.empty()) batch = sizes[0];
    xs.push_back(t);
  }
  if (inputs.size() != input_names_.size())
    for (auto& [k, v] : inputs)
      if (std::find(input_names_.begin(), input_names_.end(), k) == input_names_.end())
        throw ServingError(Code::kInvalidArgument, "unknown input '" + k + "' for signature " + sig_name);
  Tensors ys;
  std::optional<IntraOpThreadCap> cap;
  std::optional<c10::StreamGuard> on_stream;
  if (stream_) {
    // This version's stream is current for the copy in, the layers and the
    // copy out; the copy out (predict_on_batch's .to(kCPU)) waits for this
    // stream only. From page-locked memory the copy in is asynchronous.
    on_stream.emplace(*stream_);
    for (auto& x : xs)
      if (x.defined() && x.device() != device_) x = x.to(device_, /*non_blocking=*/true);
  } else if (const int n = intra_op_cap(std::max<int64_t>(batch, 1)); n > 0) {
    cap.emplace(n);
  }
  if (built_.load(std::memory_order_acquire)) {
    ys = model_->predict_on_batch(xs);  // read-only: concurrent calls are safe
  } else {
    std::lock_guard<std::mutex> l(build_mu_);  // a lazy build must not race
    ys = model_->predict_on_batch(xs);
    if (fully_built(*model_)) built_.store(true, std::memory_order_release);
  }
  TensorMap out;
  for (size_t i = 0; i < ys.size(); ++i)
    out[i < output_names_.size() ? output_names_[i] : "output_" + std::to_string(i)] = ys[i];
  return out;
}

}  // namespace kiln::serving
