// Data-parallel training throughput: the same fit() on 1 or N ranks.
//
// A compute-bound MLP (input 1024, 4 x Dense(1024, relu), Dense(10); SGD),
// synthetic data, global batch 1024 (Keras semantics: each of N ranks
// computes 1024/N rows). Run under the launcher, which gives each rank its
// share of the cores:
//
//   kiln launch --nproc_per_node 2 --threads_per_rank 1 -- \
//       build/bench/data_parallel_bench [--steps 20] [--batch 1024] [--width 1024] \
//       [--optimizer sgd|adam] [--zero_stage 0|1|2]
//
// The chief prints one line:
//   data_parallel ranks=2 threads=1 ms_per_step=... samples_per_s=...
//   allreduce_MBps=... (the gradient all-reduce alone: the gradients' bytes
//   per second) memcpy_MBps=... (one thread copying the same bytes)
//   zero_stage=... opt_state_bytes=r0,r1,... (each rank's optimizer slots
//   during fit(), from its state_dict) rss_MiB_in_fit=r0,r1,... (each
//   rank's resident memory after the last step, after malloc_trim) peak_rss_MiB=r0,r1,...
//   (each rank's peak resident memory, getrusage: includes the end of fit(),
//   where the chief gathers the whole optimizer state)
// bench/data_parallel_bench.sh runs it at 1 and 2 ranks beside PyTorch DDP
// (bench/ddp_peer.py, same model, batch, ranks and threads) and prints the
// ratios; bench/zero_bench.sh compares zero_stage 0, 1 and 2 (Adam);
// docs/PERFORMANCE.md has the figures.
#include <ATen/ATen.h>
#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "bench/step_timer.h"
#include "kiln/core/cpu_features.h"
#include "kiln/core/random.h"
#include "kiln/core/threads.h"
#include "kiln/distribute/data_parallel.h"
#include "kiln/layers/dense.h"
#include "kiln/losses/crossentropy.h"
#include "kiln/models/sequential.h"
#include "kiln/optimizers/optimizer.h"
#include "kiln/training/callback.h"

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

int main(int argc, char** argv) {
  kiln::prepare_thread_environment(argv);
  kiln::configure_threads();
  if (kiln::distribute::resolve_cluster().rank <= 0) std::printf("CPU: %s\n", kiln::cpu_features().summary().c_str());
  int64_t steps = 20, batch = 1024, width = 1024;
  int zero_stage = 0;
  std::string optimizer = "sgd";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--steps")) steps = std::atol(argv[i + 1]);
    if (!std::strcmp(argv[i], "--batch")) batch = std::atol(argv[i + 1]);
    if (!std::strcmp(argv[i], "--width")) width = std::atol(argv[i + 1]);
    if (!std::strcmp(argv[i], "--zero_stage")) zero_stage = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--optimizer")) optimizer = argv[i + 1];
  }
  auto dp =
      std::make_shared<kiln::distribute::DataParallel>(kiln::distribute::DataParallelOptions{.zero_stage = zero_stage});
  kiln::set_distribution(dp);
  kiln::set_random_seed(1);
  std::vector<kiln::LayerPtr> layers;
  for (int i = 0; i < 4; ++i) layers.push_back(kiln::layers::Dense({.units = width, .activation = "relu"}));
  layers.push_back(kiln::layers::Dense({.units = 10}));
  auto model = kiln::models::Sequential(layers, "mlp");
  // Logits and cross-entropy, as torch.nn.CrossEntropyLoss in the peer.
  auto args = kiln::CompileArgs::from_names(optimizer, "sparse_categorical_crossentropy", {});
  args.loss = std::make_shared<kiln::losses::SparseCategoricalCrossentropy>(
      kiln::losses::SparseCategoricalCrossentropyOptions{.from_logits = true});
  model->compile(args);
  at::Tensor x = at::randn({batch * steps, width});
  at::Tensor y = at::randint(0, 10, {batch * steps}, at::kLong);
  auto timer = std::make_shared<kiln::bench::StepTimer>();
  // This rank's optimizer slots while fit() runs (sharded with zero_stage).
  auto state = kiln::callbacks::LambdaCallback();
  int64_t state_bytes = 0, rss_in_fit = 0;
  state->on_epoch_end_fn = [&](int, kiln::Logs&) {
    // Resident memory after the last step (pages of /proc/self/statm), before
    // anything below allocates; malloc_trim first hands the allocator's
    // free pages back, so what remains is what is held.
    ::malloc_trim(0);
    long pages = 0, resident = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
      std::fclose(f);
    }
    rss_in_fit = static_cast<int64_t>(resident) * ::sysconf(_SC_PAGESIZE);
    state_bytes = 0;
    for (auto& [k, t] : model->compile_args().optimizer->state_dict())
      if (t.dim() > 0) state_bytes += t.nbytes();
  };
  model->fit({.x = {x},
              .y = {y},
              .batch_size = batch,
              .epochs = 1,
              .verbose = 0,
              .callbacks = {timer, state},
              .shuffle = false});
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  // Every rank's figures to the chief.
  std::vector<at::Tensor> per_rank = {at::zeros({3, dp->num_replicas()}, at::kLong)};
  per_rank[0][0][dp->replica_id()] = state_bytes;
  per_rank[0][1][dp->replica_id()] = rss_in_fit;
  per_rank[0][2][dp->replica_id()] = static_cast<int64_t>(ru.ru_maxrss) * 1024;  // KiB
  dp->all_reduce_sum(per_rank);
  std::string state_list, rss_list, peak_list;
  for (int r = 0; r < dp->num_replicas(); ++r) {
    state_list += (r ? "," : "") + std::to_string(per_rank[0][0][r].item<int64_t>());
    rss_list += (r ? "," : "") + std::to_string(per_rank[0][1][r].item<int64_t>() >> 20);
    peak_list += (r ? "," : "") + std::to_string(per_rank[0][2][r].item<int64_t>() >> 20);
  }

  // The all-reduce alone, on as many float32 values as the model has.
  int64_t params = 0;
  for (auto& v : model->trainable_weights()) params += v->value().numel();
  double mbps = 0;
  if (dp->num_replicas() > 1) {
    // As the gradient buckets go (shared memory when every rank is on this host).
    std::vector<at::Tensor> buf = {at::ones({params})};
    dp->all_reduce_sum_async(buf)();  // warm-up
    const int reps = 5;
    auto t0 = Clock::now();
    for (int r = 0; r < reps; ++r) dp->all_reduce_sum_async(buf)();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count() / reps;
    mbps = params * 4.0 / s / 1e6;
  }
  // The plain memory-copy bound for the same bytes (one thread).
  double copy_mbps = 0;
  {
    at::Tensor src = at::ones({params}), dst = at::empty({params});
    dst.copy_(src);
    const int reps = 10;
    auto t0 = Clock::now();
    for (int r = 0; r < reps; ++r) dst.copy_(src);
    copy_mbps = params * 4.0 / (std::chrono::duration<double>(Clock::now() - t0).count() / reps) / 1e6;
  }
  if (dp->replica_id() == 0)
    std::printf(
        "data_parallel ranks=%d threads=%d ms_per_step=%.2f samples_per_s=%.0f params=%lld allreduce_MBps=%.0f "
        "memcpy_MBps=%.0f path=%s optimizer=%s zero_stage=%d opt_state_bytes=%s rss_MiB_in_fit=%s "
        "peak_rss_MiB=%s\n",
        dp->num_replicas(), kiln::num_threads(), timer->ms_per_step(), batch * 1e3 / timer->ms_per_step(),
        static_cast<long long>(params), mbps, copy_mbps,
        dp->collectives() && dp->collectives()->shared_memory() ? "shm" : "gloo", optimizer.c_str(), zero_stage,
        state_list.c_str(), rss_list.c_str(), peak_list.c_str());
  return 0;
}
