// kiln's CUDA path. Tests named *CUDA* need a GPU (the test main skips them
// with a message where there is none; scripts/gpu_check.sh runs them on a
// GPU machine); the others check what a machine without a GPU must do.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "kiln/core/error.h"
#include "kiln/core/torch_compat.h"
#include "kiln/cuda/cuda.h"
#include "kiln/cuda/graph.h"
#include "kiln/cuda/streams.h"
#include "kiln/distribute/nccl.h"

namespace kiln::cuda {
namespace {
using distribute::make_nccl_backend;
using distribute::nccl_version;

TEST(Cuda, InventoryAgreesWithLibTorch) {
  const CudaInfo info = cuda_info();
  EXPECT_EQ(static_cast<int>(info.gpus.size()), compat::cuda_available() ? (int)torch::cuda::device_count() : 0);
  EXPECT_GE(info.runtime_version, 13000) << "the pinned wheel is a CUDA 13 build";
  if (info.gpus.empty()) {
    EXPECT_FALSE(info.unavailable_reason.empty());
    EXPECT_THROW(probe_gpu(0), ValueError);
    EXPECT_THROW(DeviceCopier(0), ValueError);
  }
  EXPECT_EQ(cuda_version_string(13000), "13.0");
  EXPECT_EQ(cuda_version_string(12080), "12.8");
}

TEST(Cuda, NcclVersionIsKnownWithoutAGpu) {
  EXPECT_THAT(nccl_version(), ::testing::MatchesRegex("[0-9]+\\.[0-9]+\\.[0-9]+.*"));
}

TEST(DeviceCUDA, InventoryNamesEveryGpu) {
  const CudaInfo info = cuda_info();
  ASSERT_FALSE(info.gpus.empty());
  EXPECT_GT(info.driver_version, 0);
  EXPECT_GT(info.cudnn_version, 0);
  for (const GpuInfo& g : info.gpus) {
    EXPECT_FALSE(g.name.empty());
    EXPECT_GT(g.total_memory_bytes, int64_t{1} << 30);
    EXPECT_GT(g.free_memory_bytes, 0);
    EXPECT_LE(g.free_memory_bytes, g.total_memory_bytes);
    EXPECT_GE(g.compute_major, 7);
    EXPECT_GT(g.multiprocessors, 0);
  }
}

TEST(DeviceCUDA, KilnsOwnKernelRunsOnEveryGpu) {
  for (const GpuInfo& g : cuda_info().gpus) EXPECT_TRUE(probe_gpu(g.index)) << g.name;
}

TEST(DeviceCUDA, SideStreamCopiesArriveBeforeUse) {
  DeviceCopier copier(0);
  std::vector<at::Tensor> host, dev;
  for (int i = 0; i < 8; ++i) {
    host.push_back(at::randn({1024, 1024}));  // 4 MiB each, pageable: pinned by the copier
    dev.push_back(copier.copy_async(host.back()));
  }
  copier.wait_on_current_stream();
  for (int i = 0; i < 8; ++i) {
    // A kernel on the consumer's stream right after the wait reads the copy.
    EXPECT_TRUE(at::equal((dev[i] * 2).cpu(), host[i] * 2)) << i;
  }
  EXPECT_THROW(copier.copy_async(dev[0]), ValueError);
}

TEST(DeviceCUDA, CapturedGraphReplaysWithNewInputs) {
  auto cuda = at::TensorOptions().device(at::kCUDA, 0);
  at::Tensor w = at::randn({64, 32}, cuda), x = at::zeros({16, 64}, cuda), y;
  CapturedGraph graph(0, [&] { y = at::relu(at::mm(x, w)).sum(1); });
  for (int step = 0; step < 3; ++step) {
    at::Tensor batch = at::randn({16, 64});
    x.copy_(batch.to(at::kCUDA));
    graph.replay();
    const at::Tensor eager = at::relu(at::mm(batch, w.cpu())).sum(1);
    EXPECT_TRUE(at::allclose(y.cpu(), eager, 1e-3, 1e-3)) << step;
  }
}

TEST(DeviceCUDA, CapturingHostSyncFailsWithAReason) {
  at::Tensor x = at::ones({4}, at::TensorOptions().device(at::kCUDA, 0));
  EXPECT_THROW(CapturedGraph(
                   0, [&] { (void)x.sum().item<float>(); }, /*warmup=*/0),
               Error);
  // The failed capture was ended: the GPU takes work again.
  EXPECT_EQ((x * 2).sum().item<float>(), 8.0f);
}

TEST(NcclCUDA, OneRankAllReduceAndBroadcastOnTheGpu) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto pg = make_nccl_backend(store, /*rank=*/0, /*size=*/1, /*device=*/0, /*timeout_seconds=*/60);
  std::vector<at::Tensor> t = {at::arange(10, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, 0))};
  pg->allreduce(t)->wait();
  EXPECT_TRUE(at::equal(t[0].cpu(), at::arange(10, at::kFloat)));
  pg->broadcast(t)->wait();
  EXPECT_TRUE(at::equal(t[0].cpu(), at::arange(10, at::kFloat)));
  EXPECT_THROW(make_nccl_backend(store, 0, 1, /*device=*/1000), ValueError);
}

}  // namespace
}  // namespace kiln::cuda
