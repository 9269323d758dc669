#include "kiln/training/gradient_sync.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>

#include "kiln/core/dtype.h"
#include "kiln/core/json.h"
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
    at::Tensor flat;  // float32 (bfloat16 on the wire when compressing); ZeRO 2: undefined between steps unless owned
    int64_t numel = 0;
    int root = -1;  // ZeRO 2: the owner of every member, which alone gets the sum; -1: all-reduce
    size_t members = 0, ready = 0;
    std::function<void()> wait;
  };
  std::shared_ptr<Distribution> dist;
  Optimizer* optimizer = nullptr;
  at::Device device{at::kCPU};  // the variables'; buckets and received state live there
  std::vector<VariablePtr> variables;
  std::vector<Slot> slots;  // by variable index
  std::vector<Bucket> buckets;
  std::vector<at::Tensor> hooked;
  std::vector<unsigned> hook_ids;
  bool compress = false;
  StepPipeline::Stage saved_backward, saved_reduce, saved_apply;  // put back at the end
  // ZeRO.
  int zero_stage = 0;
  int rank = 0, world = 1;
  int64_t bucket_bytes = 25 << 20;
  std::vector<int> owner;                    // by variable index (ZeRO; empty otherwise)
  std::map<std::string, int> owner_by_path;  // the same by variable path
  // Per step.
  bool active = false;    // hooks copy gradients (an applying step's backward)
  bool applying = false;  // this step's apply_gradients call updates
  double scale = 1.0;
  std::vector<char> filled;
  size_t next_launch = 0;

  at::TensorOptions float_on_device() const { return at::TensorOptions(at::kFloat).device(device); }

  bool owns_path(const std::string& path) const {
    auto it = owner_by_path.find(path);
    return it == owner_by_path.end() || it->second == rank;
  }

  void launch_ready_buckets() {
    while (next_launch < buckets.size() && buckets[next_launch].ready == buckets[next_launch].members) {
      Bucket& b = buckets[next_launch++];
      std::vector<at::Tensor> t = {compress ? b.flat.to(at::kBFloat16) : b.flat};
      auto wait = b.root >= 0 ? dist->reduce_sum_async(t, b.root) : dist->all_reduce_sum_async(t);
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
    Bucket& b = buckets[sl.bucket];
    if (!b.flat.defined()) b.flat = at::empty({b.numel}, float_on_device());  // ZeRO 2: another's bucket, this step
    at::Tensor dst = b.flat.narrow(0, sl.offset, sl.numel);
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

  // ZeRO: every owner's current values of its variables to every replica
  // (an all-gather of unequal shards). float32 variables go in chunks of at
  // most a bucket as one all-reduce each, every replica contributing its
  // own variables' values and -0.0 for the others': x + (-0.0) is exactly x
  // for every float (+0.0, -0.0, NaN and inf included), so the sum is the
  // owners' bits, and it takes the gradients' path (shared memory on one
  // host) instead of one Gloo broadcast per owner. Other dtypes: one
  // broadcast per owner.
  void broadcast_owned() {
    at::NoGradGuard ng;
    std::vector<size_t> chunk;
    int64_t chunk_numel = 0;
    auto exchange = [&] {
      if (chunk.empty()) return;
      std::vector<at::Tensor> flat = {at::empty({chunk_numel}, float_on_device())};
      int64_t off = 0;
      for (size_t i : chunk) {
        const at::Tensor& v = variables[i]->value();
        at::Tensor dst = flat[0].narrow(0, off, v.numel());
        if (owner[i] == rank)
          dst.copy_(v.detach().reshape({-1}));
        else
          dst.fill_(-0.0);
        off += v.numel();
      }
      dist->all_reduce_sum_async(flat)();
      off = 0;
      for (size_t i : chunk) {
        const at::Tensor& v = variables[i]->value();
        if (owner[i] != rank) v.detach().copy_(flat[0].narrow(0, off, v.numel()).view(v.sizes()));
        off += v.numel();
      }
      chunk.clear();
      chunk_numel = 0;
    };
    for (size_t i = 0; i < variables.size(); ++i) {
      const at::Tensor& v = variables[i]->value();
      if (v.scalar_type() != at::kFloat) continue;
      if (!chunk.empty() && (chunk_numel + v.numel()) * 4 > bucket_bytes) exchange();
      chunk.push_back(i);
      chunk_numel += v.numel();
    }
    exchange();
    for (int r = 0; r < world; ++r) {
      std::vector<at::Tensor> values;
      for (size_t i = 0; i < variables.size(); ++i)
        if (owner[i] == r && variables[i]->value().scalar_type() != at::kFloat)
          values.push_back(variables[i]->value().detach());
      if (!values.empty()) dist->broadcast(values, r);
    }
  }

  // ZeRO: the optimizer's state with every owner's slots and averages (a
  // collective). The owners go in rank order: the list of their entries
  // (JSON: key, dtype, shape) travels as bytes (a length, then the bytes),
  // then the tensors themselves, by broadcast. Only the replicas for which
  // `keep` is true keep the others' entries. Entries no variable owns
  // (iterations, the loss scale, the gradient accumulators, which hold
  // local sums) are this replica's.
  std::map<std::string, at::Tensor> gather_state(bool keep) const {
    std::map<std::string, at::Tensor> full = optimizer->state_dict();
    for (int r = 0; r < world; ++r) {
      std::vector<std::string> keys;
      std::vector<at::Tensor> tensors;
      std::string header;
      if (r == rank) {
        Json list = Json::array();
        for (const auto& [key, t] : full) {
          const auto pos = key.rfind('/');
          if (pos == std::string::npos || key.compare(pos + 1, std::string::npos, "gradient_accumulator") == 0)
            continue;
          auto it = owner_by_path.find(key.substr(0, pos));
          if (it == owner_by_path.end() || it->second != rank) continue;
          list.push_back(Json::array({key, dtype_to_string(t.scalar_type()), t.sizes().vec()}));
          tensors.push_back(t);
        }
        header = list.dump();
      }
      std::vector<at::Tensor> len = {at::full({1}, static_cast<int64_t>(header.size()), at::kLong)};
      dist->broadcast(len, r);
      std::vector<at::Tensor> bytes = {at::empty({len[0].item<int64_t>()}, at::kByte)};
      if (r == rank) std::memcpy(bytes[0].data_ptr(), header.data(), header.size());
      dist->broadcast(bytes, r);
      if (r != rank) {
        const Json list = Json::parse(
            std::string(static_cast<const char*>(bytes[0].data_ptr()), static_cast<size_t>(bytes[0].numel())));
        for (const auto& e : list) {
          keys.push_back(e.at(0).get<std::string>());
          tensors.push_back(at::empty(e.at(2).get<std::vector<int64_t>>(),
                                      at::TensorOptions(dtype_from_string(e.at(1).get<std::string>())).device(device)));
        }
      }
      if (!tensors.empty()) dist->broadcast(tensors, r);
      if (r != rank && keep)
        for (size_t i = 0; i < keys.size(); ++i) full[keys[i]] = tensors[i];
    }
    return full;
  }

  // ZeRO, when fit() starts (a collective): each variable's slots and
  // average as the chief has them go to the variable's owner, as the
  // chief's weights go to every rank. After an earlier fit() only the chief
  // holds them all, and another partition (other trainable variables) may
  // give a rank variables whose slots it lacks. One broadcast per entry,
  // each rank keeping those it owns; the entries no variable owns stay each
  // rank's own.
  void take_owned_state_from_chief() {
    std::map<std::string, at::Tensor> mine = optimizer->state_dict();
    auto variable_of = [&](const std::string& key) -> const int* {
      const auto pos = key.rfind('/');
      if (pos == std::string::npos || key.compare(pos + 1, std::string::npos, "gradient_accumulator") == 0)
        return nullptr;
      auto it = owner_by_path.find(key.substr(0, pos));
      return it == owner_by_path.end() ? nullptr : &it->second;
    };
    std::string header;
    if (rank == 0) {
      Json list = Json::array();
      for (const auto& [key, t] : mine)
        if (variable_of(key)) list.push_back(Json::array({key, dtype_to_string(t.scalar_type()), t.sizes().vec()}));
      header = list.dump();
    }
    std::vector<at::Tensor> len = {at::full({1}, static_cast<int64_t>(header.size()), at::kLong)};
    dist->broadcast(len, 0);
    std::vector<at::Tensor> bytes = {at::empty({len[0].item<int64_t>()}, at::kByte)};
    if (rank == 0) std::memcpy(bytes[0].data_ptr(), header.data(), header.size());
    dist->broadcast(bytes, 0);
    const Json list =
        Json::parse(std::string(static_cast<const char*>(bytes[0].data_ptr()), static_cast<size_t>(bytes[0].numel())));
    // This rank's variables' entries are the chief's, and only those.
    std::map<std::string, at::Tensor> kept;
    for (const auto& [key, t] : mine)
      if (!variable_of(key)) kept[key] = t;
    for (const auto& e : list) {
      const std::string key = e.at(0).get<std::string>();
      std::vector<at::Tensor> t = {
          rank == 0 ? mine.at(key)
                    : at::empty(e.at(2).get<std::vector<int64_t>>(),
                                at::TensorOptions(dtype_from_string(e.at(1).get<std::string>())).device(device))};
      dist->broadcast(t, 0);
      if (*variable_of(key) == rank) kept[key] = t[0];
    }
    mine.clear();
    optimizer->load_state_dict(kept);
  }

  void set_ownership() {
    std::weak_ptr<const State> self = weak_self;
    optimizer->set_ownership([self](const std::string& path) {
      auto s = self.lock();
      return !s || s->owns_path(path);
    });
  }
  std::weak_ptr<State> weak_self;
};

namespace {

void scale_grads(Tensors& grads, double scale) {
  if (scale == 1.0) return;
  for (auto& g : grads)
    if (g.defined()) g = g * scale;
}

// ZeRO's partition: largest variable first (ties: the earlier one), each to
// the replica with the fewest bytes so far (ties: the lower rank).
std::vector<int> partition_by_size(const std::vector<VariablePtr>& variables, int world) {
  std::vector<size_t> order(variables.size());
  std::iota(order.begin(), order.end(), 0);
  auto bytes = [&](size_t i) { return variables[i]->value().numel() * variables[i]->value().element_size(); };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return bytes(a) > bytes(b); });
  std::vector<int64_t> load(world, 0);
  std::vector<int> owner(variables.size(), 0);
  for (size_t i : order) {
    const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[i] = r;
    load[r] += bytes(i);
  }
  return owner;
}

}  // namespace

BucketPlan plan_gradient_buckets(const std::vector<int64_t>& numels, int64_t bucket_bytes,
                                 const std::vector<int>& owner, int world) {
  BucketPlan p;
  p.bucket.assign(numels.size(), 0);
  p.offset.assign(numels.size(), 0);
  const bool by_owner = !owner.empty();
  std::vector<int> open(by_owner ? world : 1, -1);  // the open bucket of each owner
  std::vector<int64_t> bytes(open.size(), 0);
  for (size_t k = numels.size(); k-- > 0;) {
    const int64_t n = numels[k];
    const int o = by_owner ? owner[k] : 0;
    if (open[o] < 0 || (bytes[o] > 0 && bytes[o] + n * 4 > bucket_bytes)) {
      open[o] = static_cast<int>(p.bucket_numel.size());
      p.bucket_numel.push_back(0);
      p.root.push_back(by_owner ? o : -1);
      bytes[o] = 0;
    }
    p.bucket[k] = static_cast<size_t>(open[o]);
    p.offset[k] = p.bucket_numel[open[o]];
    p.bucket_numel[open[o]] += n;
    bytes[o] += n * 4;
  }
  return p;
}

ReplicaGradientSync::ReplicaGradientSync(TrainState& ts, std::vector<VariablePtr> variables,
                                         std::shared_ptr<Distribution> dist)
    : ts_(ts), st_(std::make_shared<State>()) {
  State& st = *st_;
  st.dist = std::move(dist);
  st.optimizer = &ts.optimizer();
  st.variables = std::move(variables);
  st.device = st.variables.empty() ? st.dist->device() : st.variables.front()->value().device();
  const auto sync = st.dist->gradient_sync();
  st.compress = sync.compress_bf16;
  st.rank = st.dist->replica_id();
  st.world = st.dist->num_replicas();
  st.zero_stage = st.world > 1 && !st.variables.empty() ? sync.zero_stage : 0;
  st.bucket_bytes = sync.bucket_bytes;
  if (st.zero_stage > 0) {
    st.owner = partition_by_size(st.variables, st.world);
    for (size_t i = 0; i < st.variables.size(); ++i) st.owner_by_path[st.variables[i]->path()] = st.owner[i];
  }
  st.slots.resize(st.variables.size());
  std::vector<int64_t> numels;
  for (const auto& v : st.variables) numels.push_back(v->value().numel());
  const BucketPlan plan =
      plan_gradient_buckets(numels, sync.bucket_bytes, st.zero_stage == 2 ? st.owner : std::vector<int>{}, st.world);
  st.buckets.resize(plan.bucket_numel.size());
  for (size_t j = 0; j < st.buckets.size(); ++j) {
    st.buckets[j].numel = plan.bucket_numel[j];
    st.buckets[j].root = plan.root[j];
  }
  for (size_t k = 0; k < st.variables.size(); ++k) {
    st.slots[k] = {plan.bucket[k], plan.offset[k], numels[k]};
    ++st.buckets[plan.bucket[k]].members;
  }
  for (auto& b : st.buckets)
    if (b.root < 0 || b.root == st.rank) b.flat = at::zeros({b.numel}, st.float_on_device());

  std::weak_ptr<State> weak = st_;
  st.weak_self = st_;
  if (st.zero_stage > 0) {
    st.take_owned_state_from_chief();
    st.set_ownership();
  }
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
  st.saved_apply = p.apply_gradients;
  p.backward = [weak](TrainState& t, StepData& s) {
    auto st = weak.lock();
    st->applying = st->optimizer->next_call_applies();
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
    for (auto& b : st->buckets) {
      if (b.wait) b.wait();
      b.wait = nullptr;
      if (b.root >= 0 && b.root != st->rank) b.flat = at::Tensor();  // ZeRO 2: sent; its owner has the sum
    }
    for (size_t i = 0; i < st->variables.size(); ++i) {
      const auto& sl = st->slots[i];
      const at::Tensor& flat = st->buckets[sl.bucket].flat;
      if (!flat.defined()) continue;  // ZeRO 2: another replica's variable
      const at::Tensor& v = st->variables[i]->value();
      at::Tensor g = flat.narrow(0, sl.offset, sl.numel).view(v.sizes());
      s.grads[i] = g.scalar_type() == v.scalar_type() ? g : g.to(v.scalar_type());
    }
  };
  if (st.zero_stage > 0) {
    p.apply_gradients = [weak](TrainState& t, StepData& s) {
      auto st = weak.lock();
      st->saved_apply(t, s);
      if (s.variables.size() != st->variables.size()) return;
      // An applying step changed the owned variables; with use_ema an
      // accumulating step may too (the averages' overwrite).
      if (st->applying || st->optimizer->use_ema()) st->broadcast_owned();
    };
    ts.progress().with_full_optimizer_state = [weak](const std::function<void()>& fn) {
      auto st = weak.lock();
      auto full = st->gather_state(/*keep=*/st->rank == 0);
      if (st->rank != 0) return fn();
      st->optimizer->set_ownership(nullptr);
      st->optimizer->load_state_dict(full);
      full.clear();
      try {
        fn();
      } catch (...) {
        st->set_ownership();
        throw;
      }
      st->set_ownership();  // back to the owned slots
    };
  }
}

void ReplicaGradientSync::finalize_variable_values(const std::vector<VariablePtr>& vars) {
  st_->optimizer->finalize_variable_values(vars);
  if (st_->zero_stage > 0 && st_->optimizer->use_ema()) st_->broadcast_owned();
}

void ReplicaGradientSync::finish() {
  if (st_->zero_stage == 0 || st_->owner_by_path.empty()) return;
  auto full = st_->gather_state(/*keep=*/st_->rank == 0);
  st_->optimizer->set_ownership(nullptr);
  if (st_->rank == 0) st_->optimizer->load_state_dict(full);
  st_->owner_by_path.clear();                          // finished: the destructor leaves the optimizer alone
  ts_.progress().with_full_optimizer_state = nullptr;  // a later save in on_train_end: the chief has it all
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
  p.apply_gradients = st_->saved_apply;
  if (st_->zero_stage > 0) {
    ts_.progress().with_full_optimizer_state = nullptr;
    // Not finished (fit() threw): the optimizer keeps only this replica's
    // slots, now for every variable it is given.
    if (!st_->owner_by_path.empty()) st_->optimizer->set_ownership(nullptr);
  }
}

}  // namespace kiln
