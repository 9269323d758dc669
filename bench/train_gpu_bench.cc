// kiln's side of bench/gpu_bench.sh: training steps through fit() on the
// default device (the GPU where there is one), data resident on the device,
// as issue 29's table sets them. bench/gpu_peer.py is PyTorch eager's side.
//
//   build/bench/train_gpu_bench [--device cuda] [--sizes 256,1024,8192]
//                               [--steps 50] [--policies float32,mixed_bfloat16]
//                               [--mlp_rows 60000]
//
// Prints one line per workload, "kiln <workload> <policy> batch <B>:
// <ms> ms/step" (median of 3 epochs after a warm-up epoch), and for the
// Fashion-MNIST-shaped MLP (784-256-256-10, Adam, batch 128; random data of
// that shape, since the GPU machines have no dataset) "... <s> s/epoch".
#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/core/cpu_features.h"
#include "kiln/core/device.h"
#include "kiln/core/dtype.h"
#include "kiln/core/names.h"
#include "kiln/core/random.h"
#include "kiln/core/threads.h"
#include "kiln/layers/dense.h"
#include "kiln/losses/loss.h"
#include "kiln/models/sequential.h"
#include "kiln/optimizers/adam.h"
#include "kiln/training/callback.h"

using namespace kiln;
using Clock = std::chrono::steady_clock;

namespace {

// Wall time of each epoch, the device's queue drained at both ends.
class EpochClock : public Callback {
 public:
  explicit EpochClock(bool gpu) : gpu_(gpu) {}
  void on_epoch_begin(int, const Logs&) override {
    sync();
    t0_ = Clock::now();
  }
  void on_epoch_end(int, Logs&) override {
    sync();
    seconds.push_back(std::chrono::duration<double>(Clock::now() - t0_).count());
  }
  std::vector<double> seconds;

 private:
  void sync() const {
    if (gpu_) torch::cuda::synchronize();
  }
  bool gpu_;
  Clock::time_point t0_;
};

double median_after_first(std::vector<double> v) {
  if (v.size() > 1) v.erase(v.begin());
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<int64_t> parse_sizes(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(std::stoll(item));
  return out;
}

std::vector<std::string> parse_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

// Seconds per epoch of fit() over `x`/`y` (already on the device), 4 epochs.
double epoch_seconds(const std::vector<int64_t>& widths, int64_t in, int64_t classes, const at::Tensor& x,
                     const at::Tensor& y, int64_t batch, const std::string& policy, bool gpu) {
  clear_session();
  set_random_seed(1);
  set_dtype_policy(policy);
  auto m = std::make_shared<Sequential>();
  m->add(Input({in}));
  for (int64_t w : widths) m->add(std::make_shared<Dense>(w, "relu"));
  m->add(std::make_shared<Dense>(classes));
  CompileArgs args;
  args.optimizer = std::make_shared<optimizers::Adam>(Json{{"learning_rate", 1e-3}});
  args.loss =
      Loss::from_json(Json{{"class_name", "SparseCategoricalCrossentropy"}, {"config", {{"from_logits", true}}}});
  m->compile(args);
  auto clock = std::make_shared<EpochClock>(gpu);
  FitArgs fa;
  fa.x = {x};
  fa.y = {y};
  fa.epochs = 4;
  fa.batch_size = batch;
  fa.verbose = 0;
  fa.callbacks = {clock};
  m->fit(fa);
  set_dtype_policy("float32");
  return median_after_first(clock->seconds);
}

}  // namespace

int main(int argc, char** argv) {
  prepare_thread_environment(argv);
  configure_threads();
  std::string device_text, sizes = "256,1024,8192", policies = "float32,mixed_bfloat16";
  int64_t steps = 50, mlp_rows = 60000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--device")
      device_text = v;
    else if (a == "--sizes")
      sizes = v;
    else if (a == "--steps")
      steps = std::stoll(v);
    else if (a == "--policies")
      policies = v;
    else if (a == "--mlp_rows")
      mlp_rows = std::stoll(v);
    else {
      std::cerr << "unknown flag " << a << "\n";
      return 2;
    }
  }
  if (!device_text.empty()) set_default_device(resolve_device(device_text, "--device"));
  const at::Device device = default_device();
  const bool gpu = device.is_cuda();
  std::cout << "device " << device.str() << "; CPU " << cpu_features().model_name << " (" << cpu_features().flags()
            << "); threads " << at::get_num_threads() << "\n";
  at::manual_seed(0);
  // 4 x Dense(1024), `steps` batches an epoch.
  for (const std::string& policy : parse_list(policies))
    for (int64_t b : parse_sizes(sizes)) {
      at::Tensor x = at::randn({b * steps, 1024}).to(device);
      at::Tensor y = at::randint(1024, {b * steps}, at::kLong).to(device);
      const double s = epoch_seconds({1024, 1024, 1024}, 1024, 1024, x, y, b, policy, gpu);
      std::printf("kiln dense4x1024 %s batch %lld: %.3f ms/step\n", policy.c_str(), static_cast<long long>(b),
                  1e3 * s / static_cast<double>(steps));
      std::fflush(stdout);
    }
  at::Tensor x = at::rand({mlp_rows, 784}).to(device);
  at::Tensor y = at::randint(10, {mlp_rows}, at::kLong).to(device);
  const double s = epoch_seconds({256, 256}, 784, 10, x, y, 128, "float32", gpu);
  std::printf("kiln mlp784 float32 batch 128: %.3f s/epoch\n", s);
  return 0;
}
