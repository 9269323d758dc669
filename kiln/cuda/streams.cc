#include "kiln/cuda/streams.h"

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <vector>

#include "kiln/core/error.h"

namespace kiln::cuda {

struct DeviceCopier::Impl {
  c10::DeviceIndex device;
  c10::cuda::CUDAStream side;
  at::cuda::CUDAEvent done;
  // The copies started since the last wait: their memory was allocated on
  // the side stream and is handed to the consumer's stream at the wait.
  std::vector<at::Tensor> pending;
};

DeviceCopier::DeviceCopier(int device) {
  if (device < 0 || device >= static_cast<int>(c10::cuda::device_count()))
    throw ValueError("DeviceCopier: there is no GPU " + std::to_string(device) + " on this machine (" +
                     std::to_string(c10::cuda::device_count()) + " GPUs)");
  const auto index = static_cast<c10::DeviceIndex>(device);
  impl_.reset(
      new Impl{index, c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index), at::cuda::CUDAEvent(), {}});
}

DeviceCopier::~DeviceCopier() = default;

at::Tensor DeviceCopier::copy_async(const at::Tensor& host) {
  if (!host.device().is_cpu())
    throw ValueError("DeviceCopier::copy_async needs a CPU tensor; got one on " + host.device().str());
  const at::Tensor pinned = host.is_pinned() ? host : host.contiguous().pin_memory();
  c10::cuda::CUDAStreamGuard guard(impl_->side);
  // The pinned block is kept until the copy ends: LibTorch's host allocator
  // records an event on this stream for non-blocking copies from it.
  at::Tensor out = pinned.to(at::Device(at::kCUDA, impl_->device), /*non_blocking=*/true);
  impl_->pending.push_back(out);
  return out;
}

void DeviceCopier::wait_on_current_stream() {
  const c10::cuda::CUDAStream consumer = c10::cuda::getCurrentCUDAStream(impl_->device);
  impl_->done.record(impl_->side);
  impl_->done.block(consumer);
  // Memory allocated on the side stream and used on the consumer's: the
  // caching allocator must not reuse it before the consumer's work is done.
  for (const at::Tensor& t : impl_->pending)
    if (t.defined() && t.numel() > 0) c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), consumer);
  impl_->pending.clear();
}

}  // namespace kiln::cuda
