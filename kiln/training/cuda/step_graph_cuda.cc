// CapturedTrainStep on LibTorch's at::cuda::CUDAGraph (see step_graph.h).
// Streams, events and the device guard go through c10's device-generic
// interface (libc10), the graph through libtorch_cuda: libkiln_training
// then needs no CUDA library that a program linking LibTorch does not load
// already (libc10_cuda and libcudart are not on its NEEDED list, which an
// installed kiln could not resolve: scripts/check_install.sh).
#include <ATen/cuda/CUDAGraph.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <sstream>

#include "kiln/training/cuda/step_graph_impl.h"

namespace kiln {
namespace {

// The shapes, dtypes and devices a step's inputs have: a graph replays only
// for the ones it was captured with.
std::string signature(const StepData& s) {
  std::ostringstream o;
  auto add = [&](const at::Tensor& t) {
    if (!t.defined()) {
      o << "-;";
      return;
    }
    o << t.sizes() << t.scalar_type() << t.device() << ';';
  };
  for (const auto& t : s.x) add(t);
  o << '|';
  for (const auto& t : s.y) add(t);
  o << '|';
  add(s.sample_weight);
  o << '|' << s.variables.size();
  return o.str();
}

std::string first_line(std::string s) {
  if (auto nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
  return s;
}

class GraphStep final : public CapturedTrainStep::Impl {
 public:
  explicit GraphStep(const at::Device& device)
      : device_(device), impl_(c10::DeviceType::CUDA), stream_(impl_.getStreamFromGlobalPool(device, false)) {}

  void run(TrainState& ts, StepData& s, std::string& reason, int64_t& replays) override {
    c10::DeviceGuard device_guard(device_);
    // Every step runs on one non-default stream (capture cannot use the
    // legacy default stream, and warm-up belongs on the capturing stream),
    // after the work queued on the caller's (the batch's copy) and before
    // what the caller queues next (the host's reads of the metrics).
    const c10::Stream caller = impl_.getStream(device_);
    c10::Event ready(c10::DeviceType::CUDA);
    ready.record(caller);
    ready.block(stream_);
    {
      c10::StreamGuard stream_guard(stream_);
      step(ts, s, reason, replays);
    }
    c10::Event done(c10::DeviceType::CUDA);
    done.record(stream_);
    done.block(caller);
  }

 private:
  static constexpr int kWarmupSteps = 2;

  void step(TrainState& ts, StepData& s, std::string& reason, int64_t& replays) {
    const std::string sig = signature(s);
    if (captured_ && sig == captured_sig_) {
      replay(ts, s);
      ++replays;
      return;
    }
    if (captured_ || !reason.empty()) return ts.train_step(s);
    if (sig != warm_sig_) {  // warm up on these shapes first
      warm_sig_ = sig;
      warm_steps_ = 0;
    }
    if (warm_steps_ < kWarmupSteps) {
      ++warm_steps_;
      return ts.train_step(s);
    }
    if (!capture(ts, s, reason)) return ts.train_step(s);  // nothing of this step ran
    captured_sig_ = sig;
    replay(ts, s);  // a capture records the work without running it
    ++replays;
  }

  // Records forward, loss, backward and the metric updates on static input
  // buffers (copies of s's). False, with the reason, when CUDA refuses.
  bool capture(TrainState& ts, const StepData& s, std::string& reason) {
    static_ = StepData();
    static_.model = s.model;
    static_.variables = s.variables;
    static_.global_batch_size = s.global_batch_size;
    static_.training = true;
    for (const auto& t : s.x) static_.x.push_back(t.clone());
    for (const auto& t : s.y) static_.y.push_back(t.defined() ? t.clone() : t);
    if (s.sample_weight.defined()) static_.sample_weight = s.sample_weight.clone();
    stream_.synchronize();
    const StepPipeline& p = ts.pipeline();
    try {
      // Thread-local mode: the input pipeline's threads (pinned host
      // buffers) may call CUDA meanwhile; the autograd engine's device
      // thread still records onto the capturing stream.
      graph_.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
      try {
        p.forward(ts, static_);
        p.compute_loss(ts, static_);
        p.scale_loss(ts, static_);
        p.backward(ts, static_);
        p.update_metrics(ts, static_);
      } catch (...) {
        try {
          graph_.capture_end();  // a stream left capturing breaks every later CUDA call
        } catch (...) {
        }
        throw;
      }
      graph_.capture_end();
    } catch (const std::exception& e) {
      reason = "the train step could not be captured in a CUDA graph (" + first_line(e.what()) +
               "); every step runs eagerly";
      static_ = StepData();
      return false;
    }
    captured_ = true;
    return true;
  }

  // s's batch into the static buffers, the graph, then the rest of the step
  // eagerly: gradient reduction, the loss-scale check, the optimizer.
  void replay(TrainState& ts, StepData& s) {
    {
      at::NoGradGuard ng;
      for (size_t i = 0; i < s.x.size(); ++i) static_.x[i].copy_(s.x[i], /*non_blocking=*/true);
      for (size_t i = 0; i < s.y.size(); ++i)
        if (s.y[i].defined()) static_.y[i].copy_(s.y[i], /*non_blocking=*/true);
      if (s.sample_weight.defined()) static_.sample_weight.copy_(s.sample_weight, /*non_blocking=*/true);
    }
    graph_.replay();
    const StepPipeline& p = ts.pipeline();
    static_.apply_update = true;
    p.reduce_gradients(ts, static_);
    p.unscale_and_check(ts, static_);
    p.apply_gradients(ts, static_);
    s.variables = static_.variables;
  }

  at::Device device_;
  c10::impl::VirtualGuardImpl impl_;
  c10::Stream stream_;
  at::cuda::CUDAGraph graph_;
  bool captured_ = false;
  std::string captured_sig_, warm_sig_;
  int warm_steps_ = 0;
  StepData static_;  // the graph's inputs and outputs
};

}  // namespace

bool CapturedTrainStep::available() { return true; }

std::unique_ptr<CapturedTrainStep::Impl> CapturedTrainStep::Impl::create(const at::Device& device) {
  if (!device.is_cuda()) return nullptr;
  return std::make_unique<GraphStep>(device);
}

}  // namespace kiln
