// Servable: what the server loads from one version directory and runs.
// Small on purpose, so that another kind (an ensemble Predictor, an ONNX
// runtime) plugs in by registering a factory for its `model_platform`.
//
//   auto s = make_servable("kiln", "/models/mnist/3");   // loads; throws on a bad dir
//   TensorMap out = s->predict({{"inputs", x}}, "serving_default");
//
// Contract: load happens in the factory (constructor); predict() is called
// concurrently from many threads and must be thread-safe; the batch
// dimension is dim 0 of every input and output; signatures() is fixed after
// load. Destroying the servable releases its memory.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Stream.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "kiln/core/json.h"

namespace kiln {
namespace models {
class Model;
}
}  // namespace kiln

namespace kiln::serving {

// Named tensors of one request or response, in name order.
using TensorMap = std::map<std::string, at::Tensor>;

constexpr const char* kDefaultSignature = "serving_default";

class Servable {
 public:
  virtual ~Servable() = default;
  // Runs `signature` on a batch. Inputs are checked against the signature
  // (ServingError INVALID_ARGUMENT naming the input, expected and received
  // shape/dtype; a string input's shape is its logical shape); unknown
  // signature -> INVALID_ARGUMENT listing the known ones. Outputs of dtype
  // "string" are string tensors.
  virtual TensorMap predict(const TensorMap& inputs, const std::string& signature) = 0;
  // kiln's signature JSON (kiln/saving/model_io.h, model_signatures()):
  // {"serving_default": {"inputs": {name: {"dtype", "shape"}}, "outputs": {...},
  //  "method_name": "predict"|"classify"|"regress"}}. Shapes hold -1 for any size.
  virtual const Json& signatures() const = 0;
  // Bytes held (weights and buffers), for metrics and resource accounting.
  virtual int64_t memory_bytes() const = 0;
  // Where it computes: the device its state lives on (the CPU unless it
  // says otherwise). A GPU servable takes and returns host tensors; the
  // server assembles its batches in page-locked memory and gives it GPU
  // batching defaults (batching.h).
  virtual at::Device device() const { return at::Device(at::kCPU); }
  // Bytes of its state resident on device() (on the CPU: in host memory):
  // kiln_model_device_memory_bytes. Default: memory_bytes().
  virtual int64_t device_memory_bytes() const { return memory_bytes(); }
};

using ServablePtr = std::shared_ptr<Servable>;

// String tensors (Keras's tf.string, TF Serving's DT_STRING, KServe's
// BYTES): a signature input or output of dtype "string" (kStringDType)
// travels inside the server as kiln's string tensor (kiln/core/string_tensor.h:
// uint8, one more dimension than its logical shape, rows of any width).
// Front ends encode what the wire carries with strings::encode and decode
// outputs with strings::decode; batching joins widths with strings::concat.
struct StringTensorNames {
  std::set<std::string> inputs, outputs;
  bool empty() const { return inputs.empty() && outputs.empty(); }
};
// The string tensors of `signature` in `signatures` (Servable::signatures());
// none for an unknown signature.
StringTensorNames string_tensor_names(const Json& signatures, const std::string& signature);
// True when a signature entry ({"dtype", "shape"}) has dtype "string".
bool is_string_spec(const Json& spec);
// The entry of input `name` of `signature` ({"dtype", "shape"}); a null
// Json when the signature or the input is unknown.
const Json& signature_input_spec(const Json& signatures, const std::string& signature, const std::string& name);

// Loads one version directory. Throws (FormatError, NotFoundError, ...) on failure.
using ServableFactory = std::function<std::unique_ptr<Servable>(const std::string& dir)>;

// Registers a factory for `platform` (the `model_platform` of a model
// config). "kiln" (kiln::load_model directories) is registered by default.
void register_servable_factory(const std::string& platform, ServableFactory factory);
// Throws ServingError INVALID_ARGUMENT naming the known platforms if unknown.
std::unique_ptr<Servable> make_servable(const std::string& platform, const std::string& dir);
bool has_servable_platform(const std::string& platform);

// The "kiln" servable: a model directory loaded with kiln::load_model and run
// with Model::predict_on_batch under no-grad. Thread-safe, and concurrent:
// inference on a built model only reads it (layer.h), so requests run in
// parallel without a lock. Until every layer is built (load_model builds the
// graph's layers; a layer built lazily on first call would not be), calls
// are serialised; the first call that leaves everything built lifts that.
//
// A call whose work is small (rows x weights below kParallelMinWork) runs
// on one intra-op thread: splitting it costs more than it saves.
//
// On a GPU (the model loaded on the default device, kiln/core/device.h)
// each version computes on a stream of its own, taken from LibTorch's pool
// at load and made current around every call: its inputs are copied in
// (asynchronously from page-locked memory, which batching provides), its
// layers run, and the copy of the outputs back to the host waits for that
// stream only, so versions on one GPU overlap. The destructor waits for the
// stream before the weights are freed.
class ModelServable : public Servable {
 public:
  // Below this many multiply-adds' worth of work (rows x the model's weight
  // count, what a dense network spends per batch) a call runs on one
  // intra-op thread. A two-thread product wakes OpenBLAS's worker and
  // spins in sched_yield() until it finishes; for the MNIST MLP (270k
  // weights) at 32 rows that cost the server 15-25% more CPU per request
  // than one thread did, while the 10.5M-weight MLP at 32 rows served 15%
  // more with two (docs/PERFORMANCE.md, issue 15). Convolutions do more
  // work per weight, so they reach the threshold later than they should.
  static constexpr int64_t kParallelMinWork = int64_t{1} << 25;
  // The intra-op cap predict() uses for `rows` rows: 1 below the
  // threshold, else 0 (no cap).
  int intra_op_cap(int64_t rows) const { return rows * weight_count_ < kParallelMinWork ? 1 : 0; }
  int64_t weight_count() const { return weight_count_; }

  explicit ModelServable(const std::string& dir);
  ~ModelServable() override;
  TensorMap predict(const TensorMap& inputs, const std::string& signature) override;
  const Json& signatures() const override { return signatures_; }
  int64_t memory_bytes() const override { return memory_bytes_; }
  at::Device device() const override { return device_; }
  // The weights' bytes on device() (sum of their nbytes; all of them, as
  // load_model puts every variable on one device).
  int64_t device_memory_bytes() const override { return device_memory_bytes_; }
  // The stream its calls run on; nullopt on the CPU.
  const std::optional<c10::Stream>& stream() const { return stream_; }
  models::Model& model() { return *model_; }
  // True once calls run without the build lock (every layer built).
  bool runs_concurrently() const { return built_.load(std::memory_order_acquire); }

 private:
  std::shared_ptr<models::Model> model_;
  Json signatures_;
  int64_t memory_bytes_ = 0;
  int64_t weight_count_ = 0;  // elements of every weight
  at::Device device_{at::kCPU};
  int64_t device_memory_bytes_ = 0;
  std::optional<c10::Stream> stream_;  // a GPU's: this version's own
  std::vector<std::string> input_names_, output_names_;
  std::mutex build_mu_;             // serialises calls while some layer is unbuilt
  std::atomic<bool> built_{false};  // every layer built: calls need no lock
};

}  // namespace kiln::serving
