// Model parallelism under a memory cap: the same MLP trained in one process,
// by ModelParallel over 2 ranks (its hidden layers split Megatron-style:
// column- then row-parallel) and by DataParallel over 2 ranks.
//
// The model: input W, D blocks of Dense(4W, relu) + Dense(W), Dense(10);
// Adam; synthetic data; global batch B. Run under the launcher:
//
//   kiln launch --nproc_per_node 2 --threads_per_rank 1 -- \
//       build/bench/model_parallel_bench --mode model_parallel [--width 1024] [--depth 2]
//       [--steps 12] [--batch 256] [--mem_cap_mb N]
//
// --mode: single (no distribution), model_parallel, data_parallel.
// --mem_cap_mb: each process first moves itself into a memory cgroup (v1)
// of its own with that limit (the kernel kills it past the cap), so the cap
// is real, not bookkeeping; -1: a cgroup without a limit, to measure. The
// cgroup charges what the process allocates after it moved (not the shared
// libraries mapped before), reported as charged_peak_mb.
//
// Each rank prints one line:
//   model_parallel rank=0 ranks=2 ms_per_step=... weight_bytes=... optimizer_bytes=...
//   peak_rss_mb=... cap_mb=...
// weight_bytes and optimizer_bytes: what this rank holds (its shards).
// bench/model_parallel_bench.sh runs the three, sets the cap from the
// unsharded run's peak, and prints the ratios; docs/PERFORMANCE.md has the
// figures.
#include <ATen/ATen.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "bench/step_timer.h"
#include "kiln/core/cpu_features.h"
#include "kiln/core/random.h"
#include "kiln/core/threads.h"
#include "kiln/distribute/data_parallel.h"
#include "kiln/distribute/model_parallel.h"
#include "kiln/layers/dense.h"
#include "kiln/losses/crossentropy.h"
#include "kiln/models/sequential.h"
#include "kiln/optimizers/optimizer.h"
#include "kiln/training/callback.h"

namespace {

bool write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  f.flush();
  return static_cast<bool>(f);
}

// This process's memory cgroup directory (v1), or "".
std::string own_memory_cgroup() {
  std::ifstream f("/proc/self/cgroup");
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream is(line);
    std::string id, controllers, path;
    std::getline(is, id, ':');
    std::getline(is, controllers, ':');
    std::getline(is, path);
    if (controllers == "memory") return "/sys/fs/cgroup/memory" + path;
  }
  return "";
}

std::string g_parent, g_child;  // this process's cgroups: the one it came from, its own

// The most memory the process's own cgroup has charged (MB), or -1.
double charged_peak_mb() {
  std::ifstream f(g_child + "/memory.max_usage_in_bytes");
  double bytes = -1;
  return g_child.empty() || !(f >> bytes) ? -1 : bytes / (1 << 20);
}

// Moves this process into a new memory cgroup capped at `mb` (no cap: -1);
// false when the machine does not allow it. The cgroup is left empty at
// exit (the process moves back) and removed.
bool cap_memory(int64_t mb) {
  std::string& parent = g_parent;
  std::string& child = g_child;
  parent = own_memory_cgroup();
  if (parent.empty()) return false;
  child = parent + "/kiln-bench-" + std::to_string(::getpid());
  if (::mkdir(child.c_str(), 0755) != 0) return false;
  if ((mb > 0 && !write_file(child + "/memory.limit_in_bytes", std::to_string(mb << 20))) ||
      !write_file(child + "/cgroup.procs", std::to_string(::getpid()))) {
    ::rmdir(child.c_str());
    child.clear();
    return false;
  }
  std::atexit([] {
    write_file(g_parent + "/cgroup.procs", std::to_string(::getpid()));
    ::rmdir(g_child.c_str());
  });
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  kiln::prepare_thread_environment(argv);
  kiln::configure_threads();
  std::string mode = "model_parallel";
  int64_t steps = 12, batch = 256, width = 1024, depth = 2, cap_mb = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--mode")) mode = argv[i + 1];
    if (!std::strcmp(argv[i], "--steps")) steps = std::atol(argv[i + 1]);
    if (!std::strcmp(argv[i], "--batch")) batch = std::atol(argv[i + 1]);
    if (!std::strcmp(argv[i], "--width")) width = std::atol(argv[i + 1]);
    if (!std::strcmp(argv[i], "--depth")) depth = std::atol(argv[i + 1]);
    if (!std::strcmp(argv[i], "--mem_cap_mb")) cap_mb = std::atol(argv[i + 1]);
  }
  if (cap_mb != 0 && !cap_memory(cap_mb)) {
    std::fprintf(stderr, "model_parallel_bench: cannot create a memory cgroup here (needs cgroup v1, root)\n");
    return 3;
  }
  const int rank = kiln::distribute::resolve_cluster().rank;
  if (rank <= 0) std::printf("CPU: %s\n", kiln::cpu_features().summary().c_str());
  if (mode == "model_parallel") {
    kiln::distribute::DeviceMesh mesh({kiln::distribute::resolve_cluster().world_size}, {"model"});
    kiln::distribute::LayoutMap map(mesh);
    map.set("mlp/up_\\d+/kernel", {{"", "model"}});  // column-parallel
    map.set("mlp/up_\\d+/bias", {{"model"}});
    map.set("mlp/down_\\d+/kernel", {{"model", ""}});  // row-parallel
    kiln::set_distribution(std::make_shared<kiln::distribute::ModelParallel>(map, ""));
  } else if (mode == "data_parallel") {
    kiln::set_distribution(std::make_shared<kiln::distribute::DataParallel>());
  } else if (mode != "single") {
    std::fprintf(stderr, "model_parallel_bench: --mode must be single, model_parallel or data_parallel\n");
    return 2;
  }
  kiln::set_random_seed(1);
  auto model = kiln::models::Sequential(std::vector<kiln::LayerPtr>{}, "mlp");
  model->add(kiln::layers::Input({width}));
  for (int64_t i = 0; i < depth; ++i) {
    model->add(kiln::layers::Dense(4 * width, "relu", kiln::Json{{"name", "up_" + std::to_string(i)}}));
    model->add(kiln::layers::Dense(width, "linear", kiln::Json{{"name", "down_" + std::to_string(i)}}));
  }
  model->add(kiln::layers::Dense(10, "linear", kiln::Json{{"name", "head"}}));
  auto args = kiln::CompileArgs::from_names("adam", "sparse_categorical_crossentropy", {});
  args.loss = std::make_shared<kiln::losses::SparseCategoricalCrossentropy>(
      kiln::losses::SparseCategoricalCrossentropyOptions{.from_logits = true});
  model->compile(args);
  at::Tensor x = at::randn({batch * steps, width});
  at::Tensor y = at::randint(0, 10, {batch * steps}, at::kLong);
  auto timer = std::make_shared<kiln::bench::StepTimer>();
  model->fit(
      {.x = {x}, .y = {y}, .batch_size = batch, .epochs = 1, .verbose = 0, .callbacks = {timer}, .shuffle = false});

  int64_t weight_bytes = 0, optimizer_bytes = 0;
  for (auto& v : model->weights()) weight_bytes += v->value().numel() * v->value().element_size();
  for (auto& [k, t] : model->compile_args().optimizer->state_dict()) optimizer_bytes += t.numel() * t.element_size();
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  std::printf(
      "%s rank=%d ranks=%d ms_per_step=%.2f weight_bytes=%lld optimizer_bytes=%lld peak_rss_mb=%.0f "
      "charged_peak_mb=%.0f cap_mb=%lld\n",
      mode.c_str(), std::max(rank, 0), kiln::distribute::resolve_cluster().world_size, timer->ms_per_step(),
      static_cast<long long>(weight_bytes), static_cast<long long>(optimizer_bytes), ru.ru_maxrss / 1024.0,
      charged_peak_mb(), static_cast<long long>(cap_mb));
  kiln::set_distribution(nullptr);
  return 0;
}
