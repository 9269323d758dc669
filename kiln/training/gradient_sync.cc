#include "kiln/training/gradient_sync.h"

#include "kiln/core/torch_compat.h"
#include "kiln/models/model.h"
#include "kiln/optimizers/optimizer.h"
#include "kiln/training/train_state.h"

namespace kiln {

struct ReplicaGradientSync::State {
  struct Slot {
    size_t bucket = 0;
    int64_t offset = 0, numel = 0;
  };
  struct Bucket {
    at::Tensor flat;  // float32 (bfloat16 on the wire when compressing)
    size_t members = 0, ready = 0;
    std::function<void()> wait;
  };
  std::shared_ptr<Distribution> dist;
  Optimizer* optimizer = nullptr;
  std::vector<VariablePtr> variables;
  std::vector<Slot> slots;  // by variable index
  std::vector<Bucket> buckets;
  std::vector<at::Tensor> hooked;
  std::vector<unsigned> hook_ids;
  bool compress = false;
  StepPipeline::Stage saved_backward, saved_reduce;  // put back at the end
  // Per step.
  bool active = false;  // hooks copy gradients (an applying step's backward)
  double scale = 1.0;
  std::vector<char> filled;
  size_t next_launch = 0;

  void launch_ready_buckets() {
    while (next_launch < buckets.size() && buckets[next_launch].ready == buckets[next_launch].members) {
      Bucket& b = buckets[next_launch++];
      std::vector<at::Tensor> t = {compress ? b.flat.to(at::kBFloat16) : b.flat};
      auto wait = dist->all_reduce_sum_async(t);
      if (compress) {
        at::Tensor wire = t[0], flat = b.flat;
        b.wait = [wait, wire, flat]() mutable {
          wait();
          flat.copy_(wire);
        };
      } else {
        b.wait = wait;
      }
    }
  }

  // Writes variable i's contribution (gradient x scale, plus the optimizer's
  // accumulator when accumulating) into its slot and launches what is ready.
  void fill(size_t i, const at::Tensor& grad) {
    if (filled[i]) return;
    filled[i] = 1;
    const Slot& sl = slots[i];
    at::Tensor dst = buckets[sl.bucket].flat.narrow(0, sl.offset, sl.numel);
    at::NoGradGuard ng;
    if (grad.defined()) {
      dst.copy_(grad.detach().reshape({-1}));
      if (scale != 1.0) dst.mul_(scale);
    } else {
      dst.zero_();
    }
    auto& acc = optimizer->gradient_accumulators();
    if (auto it = acc.find(variables[i]->path()); it != acc.end() && it->second.defined()) {
      dst.add_(it->second.reshape({-1}).to(at::kFloat));
      it->second.zero_();
    }
    ++buckets[sl.bucket].ready;
    launch_ready_buckets();
  }
};

namespace {

void scale_grads(Tensors& grads, double scale) {
  if (scale == 1.0) return;
  for (auto& g : grads)
    if (g.defined()) g = g * scale;
}

}  // namespace

ReplicaGradientSync::ReplicaGradientSync(TrainState& ts, std::vector<VariablePtr> variables,
                                         std::shared_ptr<Distribution> dist)
    : ts_(ts), st_(std::make_shared<State>()) {
  State& st = *st_;
  st.dist = std::move(dist);
  st.optimizer = &ts.optimizer();
  st.variables = std::move(variables);
  const auto sync = st.dist->gradient_sync();
  st.compress = sync.compress_bf16;
  st.slots.resize(st.variables.size());
  // Buckets in reverse variable order (roughly the order backward fills them).
  std::vector<int64_t> sizes;
  int64_t bytes = 0;
  for (size_t k = st.variables.size(); k-- > 0;) {
    const int64_t n = st.variables[k]->value().numel();
    if (st.buckets.empty() || (bytes > 0 && bytes + n * 4 > sync.bucket_bytes)) {
      st.buckets.emplace_back();
      sizes.push_back(0);
      bytes = 0;
    }
    st.slots[k] = {st.buckets.size() - 1, sizes.back(), n};
    sizes.back() += n;
    bytes += n * 4;
    ++st.buckets.back().members;
  }
  for (size_t b = 0; b < st.buckets.size(); ++b) st.buckets[b].flat = at::zeros({sizes[b]}, at::kFloat);

  std::weak_ptr<State> weak = st_;
  for (size_t i = 0; i < st.variables.size(); ++i) {
    const at::Tensor& v = st.variables[i]->value();
    if (!v.requires_grad()) continue;
    st.hook_ids.push_back(v.register_hook([weak, i](const at::Tensor& g) {
      if (auto s = weak.lock(); s && s->active) s->fill(i, g);
    }));
    st.hooked.push_back(v);
  }

  StepPipeline& p = ts.pipeline();
  st.saved_backward = p.backward;
  st.saved_reduce = p.reduce_gradients;
  p.backward = [weak](TrainState& t, StepData& s) {
    auto st = weak.lock();
    const double scale = s.global_batch_size > 0 ? static_cast<double>(s.batch_size()) / s.global_batch_size
                                                 : 1.0 / st->dist->num_replicas();
    if (s.variables.size() != st->variables.size() || !st->optimizer->next_call_applies()) {
      // An accumulating step: local gradients only, weighted for the sum
      // the applying step makes.
      st->saved_backward(t, s);
      scale_grads(s.grads, scale);
      return;
    }
    st->scale = scale;
    st->filled.assign(st->variables.size(), 0);
    for (auto& b : st->buckets) {
      b.ready = 0;
      b.wait = nullptr;
    }
    st->next_launch = 0;
    if (s.scaled_loss.defined() && s.scaled_loss.requires_grad()) {
      st->active = true;
      try {
        s.scaled_loss.backward();
      } catch (...) {
        st->active = false;
        throw;
      }
      st->active = false;
    }
    // Variables backward did not reach contribute zeros (in index order, the
    // same on every replica).
    for (size_t i = 0; i < st->variables.size(); ++i) st->fill(i, at::Tensor());
    for (auto& v : st->variables) v->value().mutable_grad().reset();
    s.grads.assign(st->variables.size(), at::Tensor());
  };
  p.reduce_gradients = [weak](TrainState&, StepData& s) {
    auto st = weak.lock();
    if (!st->optimizer->next_call_applies() || s.variables.size() != st->variables.size()) return;
    for (auto& b : st->buckets)
      if (b.wait) b.wait();
    for (size_t i = 0; i < st->variables.size(); ++i) {
      const auto& sl = st->slots[i];
      const at::Tensor& v = st->variables[i]->value();
      at::Tensor g = st->buckets[sl.bucket].flat.narrow(0, sl.offset, sl.numel).view(v.sizes());
      s.grads[i] = g.scalar_type() == v.scalar_type() ? g : g.to(v.scalar_type());
    }
  };
}

ReplicaGradientSync::~ReplicaGradientSync() {
  for (size_t k = 0; k < st_->hooked.size(); ++k) {
    try {
      st_->hooked[k].remove_hook(st_->hook_ids[k]);
    } catch (...) {
    }
  }
  StepPipeline& p = ts_.pipeline();
  p.backward = st_->saved_backward;
  p.reduce_gradients = st_->saved_reduce;
}

}  // namespace kiln
