// A piece of GPU work captured once into a CUDA graph and replayed: one
// launch for all of its kernels instead of one per operation, which is what
// a small-batch train step is bound by. The tensors it reads and writes keep
// their addresses: write new inputs into them (copy_) before replay().
//
//   at::Tensor x = at::zeros({32, 784}, at::kCUDA), y;
//   kiln::cuda::CapturedGraph g(0, [&] { y = at::relu(at::mm(x, w)); });
//   x.copy_(batch); g.replay();   // y holds the new result
//
// What cannot be captured (host synchronisation, .item(), CPU tensors,
// shapes that change) makes the constructor throw kiln::Error with CUDA's
// reason. Thread safety: one thread per graph.
#pragma once

#include <functional>
#include <memory>

namespace kiln::cuda {

class CapturedGraph {
 public:
  // Runs `body` `warmup` times eagerly on a side stream (as PyTorch's
  // torch.cuda.graphs recipe does, so lazy initialisation happens outside
  // the capture), then once under capture on GPU `device`.
  CapturedGraph(int device, std::function<void()> body, int warmup = 3);
  ~CapturedGraph();
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;

  // Launches the captured work on the current stream.
  void replay();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::cuda
