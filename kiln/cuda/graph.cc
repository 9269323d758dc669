#include "kiln/cuda/graph.h"

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kiln/core/error.h"

namespace kiln::cuda {

struct CapturedGraph::Impl {
  at::cuda::CUDAGraph graph;
};

CapturedGraph::CapturedGraph(int device, std::function<void()> body, int warmup) : impl_(new Impl) {
  if (!body) throw ValueError("CapturedGraph needs a function to capture");
  const auto index = static_cast<c10::DeviceIndex>(device);
  c10::cuda::CUDAGuard device_guard(index);
  // Capture must not run on the legacy default stream.
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, index);
  const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(index);
  side.synchronize();
  caller.synchronize();
  {
    c10::cuda::CUDAStreamGuard stream_guard(side);
    for (int i = 0; i < warmup; ++i) body();
    side.synchronize();
    impl_->graph.capture_begin();
    try {
      body();
    } catch (const std::exception& e) {
      // End the (now invalidated) capture: a stream left capturing makes
      // every later CUDA call of the process fail ("operation not permitted
      // when stream is capturing"), NCCL's and other threads' included.
      try {
        impl_->graph.capture_end();
      } catch (const std::exception&) {
      }
      throw Error(std::string("CapturedGraph: the work could not be captured into a CUDA graph (it synchronises "
                              "with the host, touches CPU tensors or changes shape?): ") +
                  e.what());
    }
    impl_->graph.capture_end();
  }
}

CapturedGraph::~CapturedGraph() = default;

void CapturedGraph::replay() { impl_->graph.replay(); }

}  // namespace kiln::cuda
