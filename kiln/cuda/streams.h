// Host-to-GPU copies on a side stream: the copy of the next batch overlaps
// the current step, as tf.data's prefetch_to_device and PyTorch's
// pin_memory + non_blocking do.
//
//   kiln::cuda::DeviceCopier copier(0);
//   at::Tensor x = copier.copy_async(batch);   // returns at once
//   ...                                        // GPU work of the step before
//   copier.wait_on_current_stream();           // later kernels see x
//
// Thread safety: one DeviceCopier per thread.
#pragma once

#include <ATen/ATen.h>

#include <memory>

namespace kiln::cuda {

class DeviceCopier {
 public:
  // Copies to GPU `device` on a stream of its own.
  explicit DeviceCopier(int device);
  ~DeviceCopier();
  DeviceCopier(const DeviceCopier&) = delete;
  DeviceCopier& operator=(const DeviceCopier&) = delete;

  // Starts copying the CPU tensor `host` to the GPU and returns the GPU
  // tensor. A tensor not in page-locked memory is copied into pinned memory
  // first (a CPU copy). The result must not be read before
  // wait_on_current_stream().
  at::Tensor copy_async(const at::Tensor& host);
  // Makes the calling thread's current stream on the device wait (on the
  // GPU, without blocking the CPU) for every copy started so far.
  void wait_on_current_stream();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::cuda
