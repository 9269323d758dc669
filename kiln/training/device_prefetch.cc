// prefetch_to_device, model_device and to_device (declared in
// data_adapter.h). Written against c10's device-generic streams and events
// (VirtualGuardImpl), so the training library needs no CUDA headers and the
// same code serves any accelerator LibTorch registers.
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "kiln/core/device.h"
#include "kiln/models/model.h"
#include "kiln/training/data_adapter.h"

namespace kiln {
namespace {

// Host-to-device copies on a stream of their own, handed to the compute
// stream with an event (the GPU waits, the host does not).
class SideStreamCopier {
 public:
  explicit SideStreamCopier(const at::Device& device)
      : device_(device),
        impl_(device.type()),
        side_(impl_.getStreamFromGlobalPool(device, /*isHighPriority=*/false)),
        copied_(device.type()) {}

  // Starts copying every tensor of `b` to the device; returns at once.
  void start(Batch& b) {
    c10::StreamGuard on_side(side_);
    for (auto* ts : {&b.x, &b.y})
      for (auto& t : *ts) t = copy(t);
    b.sample_weight = copy(b.sample_weight);
    copied_.record(side_);
  }

  // The compute stream waits for the copies started so far, and the caching
  // allocator learns that the copies' memory (allocated on the side stream)
  // is in use on the compute stream.
  void hand_over(Batch& b) {
    const c10::Stream compute = impl_.getStream(device_);
    copied_.block(compute);
    for (auto* ts : {&b.x, &b.y})
      for (auto& t : *ts)
        if (t.defined() && t.device() == device_) t.record_stream(compute);
    if (b.sample_weight.defined() && b.sample_weight.device() == device_) b.sample_weight.record_stream(compute);
  }

 private:
  at::Tensor copy(const at::Tensor& t) const {
    if (!t.defined() || t.device() == device_) return t;
    // Page-locked memory makes the copy asynchronous; LibTorch's host
    // allocator keeps the block until the copy on this stream has ended.
    const at::Tensor src = t.device().is_cpu() && !t.is_pinned() ? t.contiguous().pin_memory() : t;
    return src.to(device_, /*non_blocking=*/true);
  }

  at::Device device_;
  c10::impl::VirtualGuardImpl impl_;
  c10::Stream side_;
  c10::Event copied_;
};

class DevicePrefetchIterator : public EpochIterator {
 public:
  DevicePrefetchIterator(std::unique_ptr<EpochIterator> inner, const at::Device& device)
      : inner_(std::move(inner)), copier_(device) {}

  std::optional<Batch> next() override {
    if (!started_) {
      ahead_ = fetch();
      started_ = true;
    }
    std::optional<Batch> current = std::move(ahead_);
    ahead_.reset();
    if (!current) return std::nullopt;
    copier_.hand_over(*current);
    ahead_ = fetch();  // overlaps the step that is about to use `current`
    return current;
  }

  void skip(int64_t n) override {
    if (n <= 0) return;
    if (!started_) return inner_->skip(n);
    if (!ahead_) return;
    ahead_.reset();
    inner_->skip(n - 1);
    ahead_ = fetch();
  }

 private:
  std::optional<Batch> fetch() {
    std::optional<Batch> b = inner_->next();
    if (b) copier_.start(*b);
    return b;
  }

  std::unique_ptr<EpochIterator> inner_;
  SideStreamCopier copier_;
  std::optional<Batch> ahead_;
  bool started_ = false;
};

class DevicePrefetchAdapter : public DataAdapter {
 public:
  DevicePrefetchAdapter(std::unique_ptr<DataAdapter> inner, const at::Device& device)
      : inner_(std::move(inner)), device_(device) {}
  int64_t num_batches() const override { return inner_->num_batches(); }
  std::unique_ptr<EpochIterator> begin_epoch(int epoch) override {
    return std::make_unique<DevicePrefetchIterator>(inner_->begin_epoch(epoch), device_);
  }
  Tensors sample_inputs() const override { return inner_->sample_inputs(); }

 private:
  std::unique_ptr<DataAdapter> inner_;
  at::Device device_;
};

}  // namespace

at::Device model_device(const models::Model& model) {
  for (const auto& v : model.weights())
    if (v && v->value().defined()) return v->value().device();
  return default_device();
}

Tensors to_device(const Tensors& ts, const at::Device& device) {
  Tensors out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(!t.defined() || t.device() == device ? t : t.to(device));
  return out;
}

std::unique_ptr<DataAdapter> prefetch_to_device(std::unique_ptr<DataAdapter> inner, const at::Device& device) {
  if (device.is_cpu()) return inner;
  return std::make_unique<DevicePrefetchAdapter>(std::move(inner), device);
}

}  // namespace kiln
