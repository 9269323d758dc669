// kiln's side of bench/gpu_bench.sh: training through fit() on the default
// device (the GPU where there is one), as issue 29's table sets them.
// bench/gpu_peer.py is PyTorch eager's side of every workload but
// `pipeline`, with the same flags and line keys.
//
//   build/bench/train_gpu_bench [--device cuda] [--workloads dense,mlp,conv,transformer,float8,pipeline]
//       [--sizes 256,1024,8192] [--steps 50] [--policies float32,mixed_bfloat16]   (dense)
//       [--mlp_rows 60000]                                       (mlp, pipeline)
//       [--conv_rows 60000]                                      (conv)
//       [--tf_batch 32] [--tf_seq 512] [--tf_d_model 1024] [--tf_heads 16]
//       [--tf_steps 10] [--peak_n 8192]                          (transformer)
//       [--f8_width 8192] [--f8_batch 8192] [--f8_steps 10]      (float8)
//
// Workloads (random data of the stated shapes, since the GPU machines have no
// dataset; Adam; every time is the median of the epochs after a warm-up
// epoch, the device's queue drained at both ends of each):
//   dense        4 x Dense(1024), float32 and mixed_bfloat16, data on the device:
//                "kiln dense4x1024 <policy> batch <B>: <ms> ms/step"
//   mlp          784-256-256-10, batch 128, one epoch of mlp_rows, on the device:
//                "kiln mlp784 float32 batch 128: <s> s/epoch"
//   conv         Keras's simple MNIST convnet (Conv2D(32,3,relu) MaxPool2D
//                Conv2D(64,3,relu) MaxPool2D Flatten Dropout(0.5)
//                Dense(10,softmax)), batch 128, one epoch of conv_rows 28x28x1
//                rows on the device: "kiln convnet float32 batch 128: <s> s/epoch"
//   transformer  MultiHeadAttention + Add + LayerNormalization + Dense(4d,relu)
//                + Dense(d) + Add + LayerNormalization, mixed_bfloat16, MSE
//                against random targets: "kiln transformer bf16 batch <B>: <ms>
//                ms/step", "kiln transformer bf16 MFU: <%> %" and the peak it
//                divides by, "kiln bf16 matmul <n>: <TFLOP/s> TFLOP/s"
//   float8       4 x Dense(f8_width) at batch f8_batch, quantize("float8")
//                (Keras's float8 training; on at::_scaled_mm where the GPU
//                has compute capability >= 8.9) against mixed_bfloat16:
//                "kiln dense4x<W> float8|bf16 batch <B>: <ms> ms/step" and
//                "kiln dense4x<W> float8 speedup over bf16: <r> x"
//   pipeline     (kiln only) the mlp epoch fed from host tensors through fit()'s
//                input path (on a GPU: pinned copies on a side stream,
//                kiln/training/device_prefetch.cc), from a Dataset
//                (from_tensor_slices -> shuffle -> batch -> prefetch), and
//                from tensors already on the device:
//                "kiln mlp784 <host-fed|dataset-fed|device-resident> batch 128:
//                <s> s/epoch", "kiln mlp784 host-fed over device-resident: <r> x"
// On the CPU every size wants to be small (bench/gpu_bench.sh's usage).
#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/core/cpu_features.h"
#include "kiln/core/device.h"
#include "kiln/core/dtype.h"
#include "kiln/core/names.h"
#include "kiln/core/random.h"
#include "kiln/core/threads.h"
#include "kiln/data/dataset.h"
#include "kiln/layers/attention.h"
#include "kiln/layers/conv.h"
#include "kiln/layers/dense.h"
#include "kiln/layers/dropout.h"
#include "kiln/layers/merging.h"
#include "kiln/layers/normalization.h"
#include "kiln/layers/pooling.h"
#include "kiln/layers/reshaping.h"
#include "kiln/losses/loss.h"
#include "kiln/models/functional.h"
#include "kiln/models/sequential.h"
#include "kiln/optimizers/adam.h"
#include "kiln/training/callback.h"

using namespace kiln;
using Clock = std::chrono::steady_clock;

namespace {

void sync(bool gpu) {
  if (gpu) torch::cuda::synchronize();
}

// Wall time of each epoch, the device's queue drained at both ends.
class EpochClock : public callbacks::Callback {
 public:
  explicit EpochClock(bool gpu) : gpu_(gpu) {}
  void on_epoch_begin(int, const Logs&) override {
    sync(gpu_);
    t0_ = Clock::now();
  }
  void on_epoch_end(int, Logs&) override {
    sync(gpu_);
    seconds.push_back(std::chrono::duration<double>(Clock::now() - t0_).count());
  }
  std::vector<double> seconds;

 private:
  bool gpu_;
  Clock::time_point t0_;
};

double median_after_first(std::vector<double> v) {
  if (v.size() > 1) v.erase(v.begin());
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<std::string> parse_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

LossPtr sparse_ce(bool from_logits) {
  return Loss::from_json(
      Json{{"class_name", "SparseCategoricalCrossentropy"}, {"config", {{"from_logits", from_logits}}}});
}

void compile_adam(models::Model& m, LossPtr loss) {
  CompileArgs args;
  args.optimizer = std::make_shared<optimizers::Adam>(Json{{"learning_rate", 1e-3}});
  args.loss = std::move(loss);
  m.compile(args);
}

// Seconds per epoch of fit() over `fa` (x/y or a dataset), 4 epochs: the
// median of the last 3.
double fit_epoch_seconds(models::Model& m, FitArgs fa, int64_t batch, bool gpu) {
  auto clock = std::make_shared<EpochClock>(gpu);
  fa.epochs = 4;
  fa.batch_size = batch;
  fa.verbose = 0;
  fa.callbacks = {clock};
  m.fit(fa);
  return median_after_first(clock->seconds);
}

// Dense(w, relu) for each of `widths`, then Dense(classes) logits, built
// under `policy` (the caller resets the global policy).
std::shared_ptr<models::SequentialImpl> mlp(const std::vector<int64_t>& widths, int64_t in, int64_t classes,
                                            const std::string& policy) {
  clear_session();
  set_random_seed(1);
  set_dtype_policy(policy);
  auto m = models::Sequential();
  m->add(layers::Input({in}));
  for (int64_t w : widths) m->add(layers::Dense(w, "relu"));
  m->add(layers::Dense(classes));
  return m;
}

double mlp_epoch_seconds(const std::vector<int64_t>& widths, int64_t in, int64_t classes, const at::Tensor& x,
                         const at::Tensor& y, int64_t batch, const std::string& policy, bool gpu,
                         const std::string& quantize = "") {
  auto m = mlp(widths, in, classes, policy);
  if (!quantize.empty()) m->quantize(quantize);
  compile_adam(*m, sparse_ce(true));
  FitArgs fa;
  fa.x = {x};
  fa.y = {y};
  const double s = fit_epoch_seconds(*m, fa, batch, gpu);
  set_dtype_policy("float32");
  return s;
}

void print_ms_per_step(const std::string& key, double ms) {
  std::printf("kiln %s: %.3f ms/step\n", key.c_str(), ms);
  std::fflush(stdout);
}

// --- dense, mlp: issue 29's first rows ---------------------------------------

void run_dense(const at::Device& device, const std::string& sizes, int64_t steps, const std::string& policies) {
  const bool gpu = device.is_cuda();
  for (const std::string& policy : parse_list(policies))
    for (const std::string& size : parse_list(sizes)) {
      const int64_t b = std::stoll(size);
      at::Tensor x = at::randn({b * steps, 1024}).to(device);
      at::Tensor y = at::randint(1024, {b * steps}, at::kLong).to(device);
      const double s = mlp_epoch_seconds({1024, 1024, 1024}, 1024, 1024, x, y, b, policy, gpu);
      print_ms_per_step("dense4x1024 " + policy + " batch " + size, 1e3 * s / static_cast<double>(steps));
    }
}

void run_mlp(const at::Device& device, int64_t rows) {
  at::Tensor x = at::rand({rows, 784}).to(device);
  at::Tensor y = at::randint(10, {rows}, at::kLong).to(device);
  const double s = mlp_epoch_seconds({256, 256}, 784, 10, x, y, 128, "float32", device.is_cuda());
  std::printf("kiln mlp784 float32 batch 128: %.3f s/epoch\n", s);
  std::fflush(stdout);
}

// --- conv: Keras's "Simple MNIST convnet" example ------------------------------

void run_conv(const at::Device& device, int64_t rows) {
  clear_session();
  set_random_seed(1);
  auto m = models::Sequential();
  m->add(layers::Input({28, 28, 1}));
  m->add(layers::Conv2D(32, 3, "relu"));
  m->add(layers::MaxPooling2D());
  m->add(layers::Conv2D(64, 3, "relu"));
  m->add(layers::MaxPooling2D());
  m->add(layers::Flatten());
  m->add(layers::Dropout(0.5));
  m->add(layers::Dense(10, "softmax"));
  compile_adam(*m, sparse_ce(false));
  FitArgs fa;
  fa.x = {at::rand({rows, 28, 28, 1}).to(device)};
  fa.y = {at::randint(10, {rows}, at::kLong).to(device)};
  const double s = fit_epoch_seconds(*m, fa, 128, device.is_cuda());
  std::printf("kiln convnet float32 batch 128: %.3f s/epoch\n", s);
  std::fflush(stdout);
}

// --- transformer block, mixed_bfloat16, and its model FLOP utilization --------

// FLOP/s of an n x n x n bfloat16 matmul on `device` (2 n^3 per product):
// the peak the MFU line divides by, measured in this process.
double bf16_matmul_flops(const at::Device& device, int64_t n) {
  const bool gpu = device.is_cuda();
  at::Tensor a = at::randn({n, n}, at::TensorOptions().device(device).dtype(at::kBFloat16));
  at::Tensor b = at::randn({n, n}, at::TensorOptions().device(device).dtype(at::kBFloat16));
  for (int i = 0; i < 3; ++i) at::matmul(a, b);
  std::vector<double> per;
  for (int rep = 0; rep < 5; ++rep) {
    const int iters = gpu ? 10 : 1;
    sync(gpu);
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) at::matmul(a, b);
    sync(gpu);
    per.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / iters);
  }
  // Best of the repetitions: a peak.
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) /
         *std::min_element(per.begin(), per.end());
}

struct TransformerShape {
  int64_t batch = 32, seq = 512, d_model = 1024, heads = 16, steps = 10;
};

// Model FLOPs of one train step (matmuls only; softmax, LayerNorm, biases and
// the optimizer left out, as MFU counts them). Forward, with B batch, S seq,
// d d_model, FFN width 4d:
//   Q, K, V and output projections  4 * 2*B*S*d*d    =  8 B S d^2
//   scores Q K^T and weights x V    2 * 2*B*S*S*d    =  4 B S^2 d
//   FFN d -> 4d -> d                2 * 2*B*S*d*4d   = 16 B S d^2
// so forward = 24 B S d^2 + 4 B S^2 d, and a train step is 3x that (the
// backward pass computes two products for each forward one).
double transformer_step_flops(const TransformerShape& t) {
  const double b = static_cast<double>(t.batch), s = static_cast<double>(t.seq), d = static_cast<double>(t.d_model);
  return 3.0 * (24.0 * b * s * d * d + 4.0 * b * s * s * d);
}

void run_transformer(const at::Device& device, const TransformerShape& t, int64_t peak_n) {
  const double peak = bf16_matmul_flops(device, peak_n);
  std::printf("kiln bf16 matmul %lld: %.2f TFLOP/s\n", static_cast<long long>(peak_n), peak / 1e12);
  std::fflush(stdout);
  clear_session();
  set_random_seed(1);
  set_dtype_policy("mixed_bfloat16");
  const int64_t d = t.d_model;
  KerasTensor in = layers::Input({t.seq, d});
  KerasTensor att = layers::MultiHeadAttention(t.heads, d / t.heads)(KerasTensors{in, in})[0];
  KerasTensor h = layers::LayerNormalization()(layers::Add()(KerasTensors{in, att})[0]);
  KerasTensor ff = layers::Dense(d)(layers::Dense(4 * d, "relu")(h));
  KerasTensor out = layers::LayerNormalization()(layers::Add()(KerasTensors{h, ff})[0]);
  auto m = models::Functional(KerasTensors{in}, KerasTensors{out});
  compile_adam(*m, Loss::from_json(Json{{"class_name", "MeanSquaredError"}, {"config", Json::object()}}));
  FitArgs fa;
  fa.x = {at::randn({t.batch * t.steps, t.seq, d}).to(device)};
  fa.y = {at::randn({t.batch * t.steps, t.seq, d}).to(device)};
  const double s = fit_epoch_seconds(*m, fa, t.batch, device.is_cuda()) / static_cast<double>(t.steps);
  set_dtype_policy("float32");
  print_ms_per_step("transformer bf16 batch " + std::to_string(t.batch), 1e3 * s);
  std::printf("kiln transformer bf16 MFU: %.1f %%\n", 100.0 * transformer_step_flops(t) / s / peak);
  std::fflush(stdout);
}

// --- float8 training against bfloat16 ----------------------------------------

void run_float8(const at::Device& device, int64_t width, int64_t batch, int64_t steps) {
  const bool gpu = device.is_cuda();
  at::Tensor x = at::randn({batch * steps, width}).to(device);
  at::Tensor y = at::randint(width, {batch * steps}, at::kLong).to(device);
  const std::vector<int64_t> hidden(3, width);
  const std::string key = "dense4x" + std::to_string(width);
  const std::string at_batch = " batch " + std::to_string(batch);
  // Keras's float8 training: a mixed_bfloat16 model, then quantize("float8")
  // (policy float8_from_mixed_bfloat16).
  const double f8 = mlp_epoch_seconds(hidden, width, width, x, y, batch, "mixed_bfloat16", gpu, "float8");
  print_ms_per_step(key + " float8" + at_batch, 1e3 * f8 / static_cast<double>(steps));
  const double bf16 = mlp_epoch_seconds(hidden, width, width, x, y, batch, "mixed_bfloat16", gpu);
  print_ms_per_step(key + " bf16" + at_batch, 1e3 * bf16 / static_cast<double>(steps));
  std::printf("kiln %s float8 speedup over bf16: %.2f x (goal >= 1.3 on an H200)\n", key.c_str(), bf16 / f8);
  std::fflush(stdout);
}

// --- input pipeline: host-fed against device-resident --------------------------

void run_pipeline(const at::Device& device, int64_t rows) {
  const bool gpu = device.is_cuda();
  at::Tensor x = at::rand({rows, 784});
  at::Tensor y = at::randint(10, {rows}, at::kLong);
  auto epoch = [&](FitArgs fa) {
    auto m = mlp({256, 256}, 784, 10, "float32");
    compile_adam(*m, sparse_ce(true));
    return fit_epoch_seconds(*m, std::move(fa), 128, gpu);
  };
  FitArgs host;
  host.x = {x};
  host.y = {y};
  const double host_s = epoch(host);
  FitArgs dataset;
  dataset.dataset = data::Dataset::from_tensor_slices({x, y}).shuffle(rows, /*seed=*/1).batch(128).prefetch(2);
  const double dataset_s = epoch(dataset);
  FitArgs resident;
  resident.x = {x.to(device)};
  resident.y = {y.to(device)};
  const double resident_s = epoch(resident);
  std::printf("kiln mlp784 host-fed batch 128: %.3f s/epoch\n", host_s);
  std::printf("kiln mlp784 dataset-fed batch 128: %.3f s/epoch\n", dataset_s);
  std::printf("kiln mlp784 device-resident batch 128: %.3f s/epoch\n", resident_s);
  std::printf("kiln mlp784 host-fed over device-resident: %.3f x (goal <= 1.05)\n", host_s / resident_s);
  std::printf("kiln mlp784 dataset-fed over device-resident: %.3f x\n", dataset_s / resident_s);
  std::fflush(stdout);
}

int usage(const std::string& why) {
  std::cerr << "train_gpu_bench: " << why
            << "\nusage: train_gpu_bench [--device D] [--workloads dense,mlp,conv,transformer,float8,pipeline] "
               "[--sizes 256,1024,8192] [--steps 50] [--policies float32,mixed_bfloat16] [--mlp_rows 60000] "
               "[--conv_rows 60000] [--tf_batch 32] [--tf_seq 512] [--tf_d_model 1024] [--tf_heads 16] "
               "[--tf_steps 10] [--peak_n 8192] [--f8_width 8192] [--f8_batch 8192] [--f8_steps 10]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  prepare_thread_environment(argv);
  configure_threads();
  std::map<std::string, std::string> flags = {{"--device", ""},
                                              {"--workloads", "dense,mlp,conv,transformer,float8,pipeline"},
                                              {"--sizes", "256,1024,8192"},
                                              {"--steps", "50"},
                                              {"--policies", "float32,mixed_bfloat16"},
                                              {"--mlp_rows", "60000"},
                                              {"--conv_rows", "60000"},
                                              {"--tf_batch", "32"},
                                              {"--tf_seq", "512"},
                                              {"--tf_d_model", "1024"},
                                              {"--tf_heads", "16"},
                                              {"--tf_steps", "10"},
                                              {"--peak_n", "8192"},
                                              {"--f8_width", "8192"},
                                              {"--f8_batch", "8192"},
                                              {"--f8_steps", "10"}};
  for (int i = 1; i < argc; i += 2) {
    auto it = flags.find(argv[i]);
    if (it == flags.end()) return usage(std::string("unknown flag ") + argv[i]);
    if (i + 1 >= argc) return usage(std::string("flag ") + argv[i] + " needs a value");
    it->second = argv[i + 1];
  }
  // A positive count; anything else ends the run with the value received.
  auto count = [&](const std::string& flag) -> int64_t {
    try {
      const int64_t v = std::stoll(flags[flag]);
      if (v > 0) return v;
    } catch (const std::exception&) {
    }
    std::cerr << "train_gpu_bench: " << flag << " must be a positive integer. Received: " << flags[flag] << "\n";
    std::exit(2);
  };
  if (!flags["--device"].empty()) set_default_device(resolve_device(flags["--device"], "--device"));
  const at::Device device = default_device();
  std::cout << "device " << device.str() << "; CPU " << cpu_features().model_name << " (" << cpu_features().flags()
            << "); threads " << at::get_num_threads() << "\n";
  at::manual_seed(0);
  TransformerShape tf{count("--tf_batch"), count("--tf_seq"), count("--tf_d_model"), count("--tf_heads"),
                      count("--tf_steps")};
  if (tf.d_model % tf.heads != 0)
    return usage("--tf_d_model must be a multiple of --tf_heads. Received: " + flags["--tf_d_model"] + " and " +
                 flags["--tf_heads"]);
  const std::vector<std::string> workloads = parse_list(flags["--workloads"]);
  for (const std::string& w : workloads)
    if (w != "dense" && w != "mlp" && w != "conv" && w != "transformer" && w != "float8" && w != "pipeline")
      return usage("unknown workload '" + w + "' in --workloads");
  for (const std::string& w : workloads) {
    if (w == "dense")
      run_dense(device, flags["--sizes"], count("--steps"), flags["--policies"]);
    else if (w == "mlp")
      run_mlp(device, count("--mlp_rows"));
    else if (w == "conv")
      run_conv(device, count("--conv_rows"));
    else if (w == "transformer")
      run_transformer(device, tf, count("--peak_n"));
    else if (w == "float8")
      run_float8(device, count("--f8_width"), count("--f8_batch"), count("--f8_steps"));
    else
      run_pipeline(device, count("--mlp_rows"));
  }
  return 0;
}
