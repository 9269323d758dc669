#include "kiln/training/data_adapter.h"

#include "kiln/core/error.h"
#include "kiln/core/random.h"

namespace kiln {
namespace {

int64_t rows(const at::Tensor& t) { return t.dim() == 0 ? 1 : t.size(0); }

// Fisher-Yates on kiln's host RNG: the same permutation on every platform
// for the same RNG state (std::shuffle's algorithm is unspecified).
at::Tensor host_permutation(int64_t n) {
  at::Tensor perm = at::arange(n, at::kLong);
  int64_t* p = perm.data_ptr<int64_t>();
  auto& rng = host_rng();
  for (int64_t i = n - 1; i > 0; --i) {
    int64_t j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
    std::swap(p[i], p[j]);
  }
  return perm;
}

class TensorIterator : public EpochIterator {
 public:
  TensorIterator(const Tensors& x, const Tensors& y, const at::Tensor& sw, int64_t batch, at::Tensor perm)
      : x_(x), y_(y), sw_(sw), batch_(batch), perm_(std::move(perm)), n_(rows(x[0])) {}

  std::optional<Batch> next() override {
    if (pos_ >= n_) return std::nullopt;
    const int64_t end = std::min(n_, pos_ + batch_);
    Batch b;
    if (perm_.defined()) {
      at::Tensor idx = perm_.narrow(0, pos_, end - pos_);
      for (auto& t : x_) b.x.push_back(t.index_select(0, idx));
      for (auto& t : y_) b.y.push_back(t.index_select(0, idx));
      if (sw_.defined()) b.sample_weight = sw_.index_select(0, idx);
    } else {
      b.x = slice_rows(x_, pos_, end);
      b.y = slice_rows(y_, pos_, end);
      if (sw_.defined()) b.sample_weight = sw_.narrow(0, pos_, end - pos_);
    }
    pos_ = end;
    return b;
  }
  void skip(int64_t n) override { pos_ = std::min(n_, pos_ + n * batch_); }

 private:
  const Tensors& x_;
  const Tensors& y_;
  const at::Tensor& sw_;
  int64_t batch_;
  at::Tensor perm_;
  int64_t n_;
  int64_t pos_ = 0;
};

class TensorAdapter : public DataAdapter {
 public:
  TensorAdapter(Tensors x, Tensors y, at::Tensor sw, int64_t batch, bool shuffle)
      : x_(std::move(x)), y_(std::move(y)), sw_(std::move(sw)), batch_(batch), shuffle_(shuffle) {}
  int64_t num_batches() const override { return (rows(x_[0]) + batch_ - 1) / batch_; }
  std::unique_ptr<EpochIterator> begin_epoch(int) override {
    at::Tensor perm;
    if (shuffle_) perm = host_permutation(rows(x_[0]));
    // Inputs kept on a GPU (a dataset that fits there) are gathered there.
    if (perm.defined() && perm.device() != x_[0].device()) perm = perm.to(x_[0].device());
    return std::make_unique<TensorIterator>(x_, y_, sw_, batch_, perm);
  }
  Tensors sample_inputs() const override { return slice_rows(x_, 0, std::min<int64_t>(batch_, rows(x_[0]))); }

 private:
  Tensors x_, y_;
  at::Tensor sw_;
  int64_t batch_;
  bool shuffle_;
};

class DatasetIteratorAdapter : public EpochIterator {
 public:
  DatasetIteratorAdapter(std::unique_ptr<data::DatasetIterator> it, size_t n_in, size_t n_out,
                         const std::map<int64_t, double>& cw)
      : it_(std::move(it)), n_in_(n_in), n_out_(n_out), cw_(cw) {}

  std::optional<Batch> next() override {
    auto e = it_->next();
    if (!e) return std::nullopt;
    const size_t k = e->size();
    Batch b;
    if (k < n_in_ || (n_out_ > 0 && k != n_in_ && k != n_in_ + n_out_ && k != n_in_ + n_out_ + 1))
      throw ValueError("a dataset element has " + std::to_string(k) + " tensor(s); the model takes " +
                       std::to_string(n_in_) + " input(s) and gives " + std::to_string(n_out_) +
                       " output(s), so elements must be (inputs..., targets..., [sample_weight])");
    b.x.assign(e->begin(), e->begin() + n_in_);
    if (n_out_ > 0 && k > n_in_) {
      b.y.assign(e->begin() + n_in_, e->begin() + n_in_ + n_out_);
      if (k == n_in_ + n_out_ + 1) b.sample_weight = e->back();
    }
    if (!cw_.empty() && !b.y.empty()) {
      at::Tensor w = class_weights_for(b.y[0], cw_);
      b.sample_weight = b.sample_weight.defined() ? b.sample_weight.to(at::kFloat) * w : w;
    }
    return b;
  }
  void skip(int64_t n) override { it_->skip_batches(n); }

 private:
  std::unique_ptr<data::DatasetIterator> it_;
  size_t n_in_, n_out_;
  std::map<int64_t, double> cw_;
};

class DatasetAdapter : public DataAdapter {
 public:
  DatasetAdapter(data::Dataset ds, size_t n_in, size_t n_out, std::map<int64_t, double> cw)
      : ds_(std::move(ds)), n_in_(n_in), n_out_(n_out), cw_(std::move(cw)) {}
  int64_t num_batches() const override { return ds_.cardinality(); }
  std::unique_ptr<EpochIterator> begin_epoch(int epoch) override {
    return std::make_unique<DatasetIteratorAdapter>(ds_.iterator(epoch), n_in_, n_out_, cw_);
  }
  Tensors sample_inputs() const override {
    auto it = ds_.iterator(0);
    auto e = it->next();
    if (!e) throw ValueError("the dataset is empty");
    if (e->size() < n_in_)
      throw ValueError("a dataset element has " + std::to_string(e->size()) + " tensor(s); the model takes " +
                       std::to_string(n_in_) + " input(s)");
    return Tensors(e->begin(), e->begin() + n_in_);
  }

 private:
  data::Dataset ds_;
  size_t n_in_, n_out_;
  std::map<int64_t, double> cw_;
};

}  // namespace

Tensors slice_rows(const Tensors& ts, int64_t begin, int64_t end) {
  Tensors out;
  out.reserve(ts.size());
  for (auto& t : ts) out.push_back(t.narrow(0, begin, end - begin));
  return out;
}

at::Tensor class_weights_for(const at::Tensor& y, const std::map<int64_t, double>& class_weight) {
  at::Tensor cls;
  if (y.dim() >= 2 && y.size(-1) > 1) {
    if (!at::isFloatingType(y.scalar_type()) || y.dim() != 2)
      throw ValueError(
          "class_weight needs targets of shape (N,), (N, 1) or one-hot (N, C). Received targets of shape " +
          std::string(c10::str(y.sizes())));
    cls = y.argmax(-1);
  } else {
    cls = y.reshape({y.dim() == 0 ? 1 : y.size(0)});
    if (at::isFloatingType(cls.scalar_type())) cls = cls.round();
    cls = cls.to(at::kLong);
  }
  int64_t max_class = cls.numel() ? cls.max().item<int64_t>() : 0;
  for (auto& [c, w] : class_weight) {
    if (c < 0) throw ValueError("class_weight keys must be class indices >= 0. Received: " + std::to_string(c));
    max_class = std::max(max_class, c);
  }
  if (cls.numel() && cls.min().item<int64_t>() < 0)
    throw ValueError("class_weight: targets hold a negative class index");
  at::Tensor table = at::ones({max_class + 1}, at::kFloat);
  for (auto& [c, w] : class_weight) table[c] = w;
  return table.index_select(0, cls);
}

std::unique_ptr<DataAdapter> make_tensor_adapter(const Tensors& x, const Tensors& y, const at::Tensor& sample_weight,
                                                 int64_t batch_size, bool shuffle,
                                                 const std::map<int64_t, double>& class_weight) {
  if (x.empty()) throw ValueError("no input data: pass x (one tensor per model input) or a dataset");
  if (batch_size <= 0)
    throw ValueError("batch_size must be a positive integer. Received: batch_size=" + std::to_string(batch_size));
  const int64_t n = rows(x[0]);
  for (size_t i = 0; i < x.size(); ++i) {
    if (!x[i].defined()) throw ValueError("x[" + std::to_string(i) + "] is an undefined tensor");
    if (rows(x[i]) != n)
      throw ValueError("all inputs must have the same number of samples: x[0] has " + std::to_string(n) + ", x[" +
                       std::to_string(i) + "] has " + std::to_string(rows(x[i])));
  }
  for (size_t i = 0; i < y.size(); ++i) {
    if (!y[i].defined()) throw ValueError("y[" + std::to_string(i) + "] is an undefined tensor");
    if (rows(y[i]) != n)
      throw ValueError("x and y must have the same number of samples: x has " + std::to_string(n) + " and y has " +
                       std::to_string(rows(y[i])) + (y.size() > 1 ? " (y[" + std::to_string(i) + "])" : ""));
  }
  if (n == 0) throw ValueError("the input data has 0 samples");
  at::Tensor sw;
  if (sample_weight.defined()) {
    if (sample_weight.dim() == 0 || rows(sample_weight) != n)
      throw ValueError("sample_weight must have one weight per sample: x has " + std::to_string(n) +
                       " samples and sample_weight has shape " + std::string(c10::str(sample_weight.sizes())));
    sw = sample_weight.to(at::kFloat);
  }
  if (!class_weight.empty()) {
    if (y.empty()) throw ValueError("class_weight needs targets y");
    at::Tensor w = class_weights_for(y[0], class_weight);
    sw = sw.defined() ? sw * w : w;
  }
  return std::make_unique<TensorAdapter>(x, y, sw, batch_size, shuffle);
}

std::unique_ptr<DataAdapter> make_dataset_adapter(const data::Dataset& ds, size_t num_inputs, size_t num_outputs,
                                                  const std::map<int64_t, double>& class_weight) {
  return std::make_unique<DatasetAdapter>(ds, num_inputs, num_outputs, class_weight);
}

namespace {

class ShardIterator : public EpochIterator {
 public:
  ShardIterator(std::unique_ptr<EpochIterator> inner, std::shared_ptr<Distribution> dist)
      : inner_(std::move(inner)), dist_(std::move(dist)), num_(dist_->num_replicas()), index_(dist_->replica_id()) {}

  std::optional<Batch> next() override { return dist_->split_batches() ? next_split() : next_agreed(); }
  void skip(int64_t n) override { inner_->skip(n); }

 private:
  std::optional<Batch> next_split() {
    for (;;) {
      auto b = inner_->next();
      if (!b) return std::nullopt;
      const int64_t total = b->x.empty() ? 0 : rows(b->x[0]);
      if (total < num_) continue;  // too few rows to give every replica one
      const int64_t base = total / num_, extra = total % num_;
      const int64_t begin = index_ * base + std::min<int64_t>(index_, extra);
      const int64_t len = base + (index_ < extra ? 1 : 0);
      Batch out;
      out.x = slice_rows(b->x, begin, begin + len);
      out.y = slice_rows(b->y, begin, begin + len);
      if (b->sample_weight.defined()) out.sample_weight = b->sample_weight.narrow(0, begin, len);
      out.global_rows = total;
      return out;
    }
  }

  // Every replica says whether it has a batch and how many rows; all stop
  // when one has none.
  std::optional<Batch> next_agreed() {
    auto b = inner_->next();
    const int64_t n = b && !b->x.empty() ? rows(b->x[0]) : 0;
    std::vector<at::Tensor> t = {at::tensor({b ? int64_t{0} : int64_t{1}, n}, at::kLong)};
    dist_->all_reduce_sum(t);
    if (t[0][0].item<int64_t>() > 0) return std::nullopt;
    b->global_rows = t[0][1].item<int64_t>();
    return b;
  }

  std::unique_ptr<EpochIterator> inner_;
  std::shared_ptr<Distribution> dist_;
  int num_, index_;
};

class ShardAdapter : public DataAdapter {
 public:
  ShardAdapter(std::unique_ptr<DataAdapter> inner, std::shared_ptr<Distribution> dist)
      : inner_(std::move(inner)), dist_(std::move(dist)) {}
  int64_t num_batches() const override { return inner_->num_batches(); }
  std::unique_ptr<EpochIterator> begin_epoch(int epoch) override {
    return std::make_unique<ShardIterator>(inner_->begin_epoch(epoch), dist_);
  }
  Tensors sample_inputs() const override { return inner_->sample_inputs(); }

 private:
  std::unique_ptr<DataAdapter> inner_;
  std::shared_ptr<Distribution> dist_;
};

}  // namespace

std::unique_ptr<DataAdapter> shard_batches(std::unique_ptr<DataAdapter> inner) {
  auto dist = distribution();
  if (!dist || dist->num_replicas() <= 1) return inner;
  return std::make_unique<ShardAdapter>(std::move(inner), std::move(dist));
}

}  // namespace kiln
