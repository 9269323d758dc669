// Transformations: shuffle, take, skip, shard, repeat (each written once and
// instantiated for elements and for row indices), batch, unbatch and map.
#include <ATen/ATen.h>

#include <deque>
#include <future>
#include <limits>
#include <mutex>
#include <random>
#include <thread>

#include "kiln/core/error.h"
#include "kiln/core/thread_pool.h"
#include "kiln/data/dataset_node.h"

namespace kiln {
namespace {

constexpr int64_t kAll = std::numeric_limits<int64_t>::max();

// The ordering ops below are templates over what they move: T = Element
// (tensors, through DatasetIterator) or T = int64_t (row numbers, through
// IndexStream). Both instantiations make the same decisions in the same
// order, which is what lets batch() take the index path without changing
// which rows land in which batch.
template <class T>
struct Traits;
template <>
struct Traits<Element> {
  using Iter = data::DatasetIterator;
  static int64_t skip(data::DatasetIterator& it, int64_t n) { return it.skip_batches(n); }
};
template <>
struct Traits<int64_t> {
  using Iter = IndexStream;
  static int64_t skip(IndexStream& s, int64_t n) { return s.skip(n); }
};
template <class T>
using IterOf = typename Traits<T>::Iter;
template <class T>
using Opener = std::function<std::unique_ptr<IterOf<T>>(uint64_t key)>;

// Exposes an op as a DatasetIterator or an IndexStream.
template <class T, class Op>
class Adapter;
template <class Op>
class Adapter<Element, Op> : public data::DatasetIterator {
 public:
  template <class... A>
  explicit Adapter(A&&... a) : op_(std::forward<A>(a)...) {}
  std::optional<Element> next() override { return op_.next(); }
  int64_t skip_batches(int64_t n) override { return op_.skip(n); }

 private:
  Op op_;
};
template <class Op>
class Adapter<int64_t, Op> : public IndexStream {
 public:
  template <class... A>
  explicit Adapter(A&&... a) : op_(std::forward<A>(a)...) {}
  std::optional<int64_t> next() override { return op_.next(); }
  int64_t skip(int64_t n) override { return op_.skip(n); }

 private:
  Op op_;
};

// ------------------------------------------------------------------- take

struct TakeParams {
  int64_t n;  // -1: all
};
template <class T>
class TakeOp {
 public:
  TakeOp(const Opener<T>& open, uint64_t key, const TakeParams& p) : in_(open(key)), left_(p.n) {}
  std::optional<T> next() {
    if (left_ == 0) return std::nullopt;
    auto x = in_->next();
    if (!x) {
      left_ = 0;
      return std::nullopt;
    }
    if (left_ > 0) --left_;
    return x;
  }
  int64_t skip(int64_t n) {
    const int64_t want = left_ < 0 ? n : std::min(n, left_);
    const int64_t got = Traits<T>::skip(*in_, want);
    if (left_ > 0) left_ -= got;
    if (got < want) left_ = 0;
    return got;
  }

 private:
  std::unique_ptr<IterOf<T>> in_;
  int64_t left_;
};

// ------------------------------------------------------------------- skip

struct SkipParams {
  int64_t n;  // -1: all
};
template <class T>
class SkipOp {
 public:
  SkipOp(const Opener<T>& open, uint64_t key, const SkipParams& p) : in_(open(key)), pending_(p.n < 0 ? kAll : p.n) {}
  std::optional<T> next() {
    drop_prefix();
    return in_->next();
  }
  int64_t skip(int64_t n) {
    drop_prefix();
    return Traits<T>::skip(*in_, n);
  }

 private:
  void drop_prefix() {
    if (pending_ > 0) Traits<T>::skip(*in_, pending_);
    pending_ = 0;
  }
  std::unique_ptr<IterOf<T>> in_;
  int64_t pending_;
};

// ------------------------------------------------------------------ shard

struct ShardParams {
  int64_t num_shards;
  int64_t index;
};
template <class T>
class ShardOp {
 public:
  ShardOp(const Opener<T>& open, uint64_t key, const ShardParams& p)
      : in_(open(key)), stride_(p.num_shards), pending_(p.index) {}
  std::optional<T> next() {
    if (done_) return std::nullopt;
    if (pending_ > 0 && Traits<T>::skip(*in_, pending_) < pending_) return finish();
    pending_ = stride_ - 1;
    auto x = in_->next();
    if (!x) return finish();
    return x;
  }
  int64_t skip(int64_t n) {
    int64_t done = 0;
    while (done < n && !done_) {
      if (pending_ > 0 && Traits<T>::skip(*in_, pending_) < pending_) break;
      pending_ = stride_ - 1;
      if (Traits<T>::skip(*in_, 1) < 1) break;
      ++done;
    }
    if (done < n) done_ = true;
    return done;
  }

 private:
  std::optional<T> finish() {
    done_ = true;
    return std::nullopt;
  }
  std::unique_ptr<IterOf<T>> in_;
  int64_t stride_;
  int64_t pending_;  // input elements to drop before the next one we keep
  bool done_ = false;
};

// ----------------------------------------------------------------- repeat

struct RepeatParams {
  int64_t count;  // -1: forever
};
template <class T>
class RepeatOp {
 public:
  RepeatOp(Opener<T> open, uint64_t key, const RepeatParams& p) : open_(std::move(open)), key_(key), count_(p.count) {}
  std::optional<T> next() {
    while (open_next()) {
      auto x = in_->next();
      if (x) {
        produced_ = true;
        return x;
      }
      close_current();
    }
    return std::nullopt;
  }
  int64_t skip(int64_t n) {
    int64_t done = 0;
    while (done < n && open_next()) {
      const int64_t got = Traits<T>::skip(*in_, n - done);
      if (got > 0) produced_ = true;
      done += got;
      if (done < n) close_current();
    }
    return done;
  }

 private:
  // Makes in_ the current repetition's iterator; false when all are done.
  bool open_next() {
    if (in_) return true;
    if (done_ || (count_ >= 0 && rep_ >= count_)) return false;
    // Repetition 0 keeps the pass key, so repeat(1) is the identity; later
    // ones get their own key, so a reshuffling shuffle differs per repetition.
    in_ = open_(rep_ == 0 ? key_ : combine_keys(key_, static_cast<uint64_t>(rep_)));
    produced_ = false;
    return true;
  }
  void close_current() {
    in_.reset();
    ++rep_;
    if (!produced_) done_ = true;  // an empty pass: stop rather than spin forever
  }

  Opener<T> open_;
  uint64_t key_;
  int64_t count_;
  int64_t rep_ = 0;
  std::unique_ptr<IterOf<T>> in_;
  bool produced_ = false;
  bool done_ = false;
};

// ---------------------------------------------------------------- shuffle

struct ShuffleParams {
  int64_t buffer_size;
  uint64_t seed;
  bool reshuffle;
};

// Uniform in [0, n) without modulo bias; spelled out (not
// std::uniform_int_distribution) so the order is the same with every
// standard library.
uint64_t uniform_below(std::mt19937_64& rng, uint64_t n) {
  const uint64_t threshold = (0 - n) % n;  // 2^64 mod n
  for (;;) {
    const uint64_t x = rng();
    if (x >= threshold) return x % n;
  }
}

// tf.data's shuffle buffer: keep up to buffer_size elements, emit a uniformly
// chosen one, refill from the input.
template <class T>
class ShuffleOp {
 public:
  ShuffleOp(const Opener<T>& open, uint64_t key, const ShuffleParams& p)
      : in_(open(key)), capacity_(p.buffer_size), rng_(p.reshuffle ? combine_keys(p.seed, key) : mix64(p.seed)) {}
  std::optional<T> next() {
    while (!input_done_ && static_cast<int64_t>(buffer_.size()) < capacity_) {
      auto x = in_->next();
      if (!x) {
        input_done_ = true;
        in_.reset();
        break;
      }
      if (buffer_.capacity() == 0) buffer_.reserve(std::min<int64_t>(capacity_, 1 << 16));
      buffer_.push_back(std::move(*x));
    }
    if (buffer_.empty()) return std::nullopt;
    const size_t i = uniform_below(rng_, buffer_.size());
    T out = std::move(buffer_[i]);
    if (i + 1 != buffer_.size()) buffer_[i] = std::move(buffer_.back());
    buffer_.pop_back();
    return out;
  }
  int64_t skip(int64_t n) {
    int64_t done = 0;
    while (done < n && next()) ++done;
    return done;
  }

 private:
  std::unique_ptr<IterOf<T>> in_;
  int64_t capacity_;
  std::mt19937_64 rng_;
  std::vector<T> buffer_;
  bool input_done_ = false;
};

// Ordering node: one op over either the input's elements or, when the input
// is row-indexed, its row numbers (so the node is row-indexed too).
template <template <class> class Op, class Params>
class OrderNode : public DatasetNode {
 public:
  OrderNode(NodePtr input, Params p, int64_t cardinality)
      : input_(std::move(input)), params_(p), cardinality_(cardinality) {}

  std::unique_ptr<data::DatasetIterator> make_iterator(uint64_t key) const override {
    if (input_->row_source()) return make_row_iterator(shared_from_this(), row_source(), index_stream(key));
    NodePtr in = input_;
    Opener<Element> open = [in](uint64_t k) { return in->make_iterator(k); };
    return std::make_unique<Adapter<Element, Op<Element>>>(open, key, params_);
  }
  int64_t cardinality() const override { return cardinality_; }
  bool in_memory() const override { return input_->in_memory(); }
  const Element* row_source() const override { return input_->row_source(); }
  std::unique_ptr<IndexStream> index_stream(uint64_t key) const override {
    if (!input_->row_source()) return nullptr;
    NodePtr in = input_;
    Opener<int64_t> open = [in](uint64_t k) { return in->index_stream(k); };
    return std::make_unique<Adapter<int64_t, Op<int64_t>>>(open, key, params_);
  }

 private:
  NodePtr input_;
  Params params_;
  int64_t cardinality_;
};

bool known(int64_t c) { return c >= 0; }

// ------------------------------------------------------------------ batch

class StackBatchIterator : public data::DatasetIterator {
 public:
  StackBatchIterator(std::unique_ptr<data::DatasetIterator> in, int64_t batch_size, bool drop)
      : in_(std::move(in)), batch_size_(batch_size), drop_(drop) {}
  std::optional<Element> next() override {
    if (done_) return std::nullopt;
    std::vector<Element> rows;
    rows.reserve(std::min<int64_t>(batch_size_, 4096));
    while (static_cast<int64_t>(rows.size()) < batch_size_) {
      auto e = in_->next();
      if (!e) {
        done_ = true;
        break;
      }
      if (!rows.empty()) check_same_structure(rows[0], *e, static_cast<int64_t>(rows.size()));
      rows.push_back(std::move(*e));
    }
    if (rows.empty() || (drop_ && static_cast<int64_t>(rows.size()) < batch_size_)) return std::nullopt;
    Element out;
    out.reserve(rows[0].size());
    std::vector<at::Tensor> parts(rows.size());
    for (size_t j = 0; j < rows[0].size(); ++j) {
      for (size_t r = 0; r < rows.size(); ++r) parts[r] = rows[r][j];
      out.push_back(at::stack(parts, 0));
    }
    return out;
  }
  int64_t skip_batches(int64_t n) override {
    if (done_ || n <= 0) return 0;
    const int64_t want = n > kAll / batch_size_ ? kAll : n * batch_size_;
    const int64_t got = in_->skip_batches(want);
    if (got == want) return n;
    done_ = true;
    return got / batch_size_ + (got % batch_size_ != 0 && !drop_ ? 1 : 0);
  }

 private:
  std::unique_ptr<data::DatasetIterator> in_;
  int64_t batch_size_;
  bool drop_;
  bool done_ = false;
};

// The fast path: rows of the source tensors gathered with one index_select
// per tensor, or a narrow view when they are consecutive (unshuffled data).
class GatherBatchIterator : public data::DatasetIterator {
 public:
  GatherBatchIterator(NodePtr owner, const Element* source, std::unique_ptr<IndexStream> stream, int64_t batch_size,
                      bool drop)
      : owner_(std::move(owner)), source_(source), stream_(std::move(stream)), batch_size_(batch_size), drop_(drop) {
    rows_.reserve(std::min<int64_t>(batch_size_, 1 << 20));
  }
  std::optional<Element> next() override {
    if (done_) return std::nullopt;
    rows_.clear();
    const int64_t n = stream_->next_block(&rows_, batch_size_);
    if (n < batch_size_) done_ = true;
    if (n == 0 || (drop_ && n < batch_size_)) return std::nullopt;
    bool consecutive = true;
    for (int64_t k = 1; k < n && consecutive; ++k) consecutive = rows_[k] == rows_[0] + k;
    Element out;
    out.reserve(source_->size());
    if (consecutive) {
      for (const auto& t : *source_) out.push_back(t.narrow(0, rows_[0], n));
      return out;
    }
    const at::Tensor index = at::from_blob(rows_.data(), {n}, at::TensorOptions().dtype(at::kLong));
    for (const auto& t : *source_) {
      out.push_back(t.index_select(0, t.device() == index.device() ? index : index.to(t.device())));
    }
    return out;
  }
  int64_t skip_batches(int64_t n) override {
    if (done_ || n <= 0) return 0;
    const int64_t want = n > kAll / batch_size_ ? kAll : n * batch_size_;
    const int64_t got = stream_->skip(want);
    if (got == want) return n;
    done_ = true;
    return got / batch_size_ + (got % batch_size_ != 0 && !drop_ ? 1 : 0);
  }

 private:
  NodePtr owner_;          // keeps *source_ alive
  const Element* source_;  // owned by owner_
  std::unique_ptr<IndexStream> stream_;
  int64_t batch_size_;
  bool drop_;
  std::vector<int64_t> rows_;
  bool done_ = false;
};

class BatchNode : public DatasetNode {
 public:
  BatchNode(NodePtr input, int64_t batch_size, bool drop)
      : input_(std::move(input)), batch_size_(batch_size), drop_(drop) {}
  std::unique_ptr<data::DatasetIterator> make_iterator(uint64_t key) const override {
    if (const Element* source = input_->row_source()) {
      return std::make_unique<GatherBatchIterator>(shared_from_this(), source, input_->index_stream(key), batch_size_,
                                                   drop_);
    }
    return std::make_unique<StackBatchIterator>(input_->make_iterator(key), batch_size_, drop_);
  }
  int64_t cardinality() const override {
    const int64_t c = input_->cardinality();
    if (!known(c)) return c;
    return drop_ ? c / batch_size_ : (c + batch_size_ - 1) / batch_size_;
  }
  bool in_memory() const override { return input_->in_memory(); }

 private:
  NodePtr input_;
  int64_t batch_size_;
  bool drop_;
};

// ---------------------------------------------------------------- unbatch

class UnbatchIterator : public data::DatasetIterator {
 public:
  explicit UnbatchIterator(std::unique_ptr<data::DatasetIterator> in) : in_(std::move(in)) {}
  std::optional<Element> next() override {
    while (pos_ >= len_) {
      auto e = in_->next();
      if (!e) return std::nullopt;
      check(*e);
      current_ = std::move(*e);
      pos_ = 0;
      len_ = current_.empty() ? 0 : current_[0].size(0);
    }
    Element out;
    out.reserve(current_.size());
    for (const auto& t : current_) out.push_back(t.select(0, pos_));
    ++pos_;
    return out;
  }

 private:
  static void check(const Element& e) {
    for (size_t j = 0; j < e.size(); ++j) {
      if (e[j].dim() == 0) {
        throw ShapeError("Dataset.unbatch: component " + std::to_string(j) +
                         " is a scalar; unbatch needs tensors with a leading batch dimension");
      }
      if (e[j].size(0) != e[0].size(0)) {
        throw ShapeError("Dataset.unbatch: the components of an element disagree on dim 0: component 0 has shape " +
                         shape_string(e[0]) + ", component " + std::to_string(j) + " has shape " + shape_string(e[j]));
      }
    }
  }
  std::unique_ptr<data::DatasetIterator> in_;
  Element current_;
  int64_t pos_ = 0;
  int64_t len_ = 0;
};

class UnbatchNode : public DatasetNode {
 public:
  explicit UnbatchNode(NodePtr input) : input_(std::move(input)) {}
  std::unique_ptr<data::DatasetIterator> make_iterator(uint64_t key) const override {
    return std::make_unique<UnbatchIterator>(input_->make_iterator(key));
  }
  int64_t cardinality() const override {
    const int64_t c = input_->cardinality();
    return c == kInfiniteCardinality || c == 0 ? c : kUnknownCardinality;
  }
  bool in_memory() const override { return input_->in_memory(); }

 private:
  NodePtr input_;
};

// -------------------------------------------------------------------- map

using MapFn = std::function<Element(const Element&)>;

class SerialMapIterator : public data::DatasetIterator {
 public:
  SerialMapIterator(std::shared_ptr<const MapFn> fn, std::unique_ptr<data::DatasetIterator> in)
      : fn_(std::move(fn)), in_(std::move(in)) {}
  std::optional<Element> next() override {
    auto e = in_->next();
    if (!e) return std::nullopt;
    return (*fn_)(*e);
  }
  int64_t skip_batches(int64_t n) override { return in_->skip_batches(n); }

 private:
  std::shared_ptr<const MapFn> fn_;
  std::unique_ptr<data::DatasetIterator> in_;
};

// Reads the input on the caller's thread, runs fn on the pool, and returns
// results in input order (a deque of futures, at most 2x the workers deep).
class ParallelMapIterator : public data::DatasetIterator {
 public:
  ParallelMapIterator(std::shared_ptr<const MapFn> fn, std::unique_ptr<data::DatasetIterator> in, int workers)
      : fn_(std::move(fn)), in_(std::move(in)), workers_(workers) {}
  // Queued calls are dropped, running ones waited for, before the futures and input go.
  ~ParallelMapIterator() override { pool_.reset(); }
  std::optional<Element> next() override {
    if (!pool_)
      pool_ = std::make_unique<ThreadPool>(
          ThreadPoolOptions{.num_threads = workers_, .on_thread_start = use_one_intra_op_thread_here});
    while (!input_done_ && static_cast<int>(in_flight_.size()) < 2 * workers_) {
      std::optional<Element> e;
      try {
        e = in_->next();
      } catch (...) {
        // Delivered after the elements already in flight, in order.
        std::promise<Element> p;
        p.set_exception(std::current_exception());
        in_flight_.push_back(p.get_future());
        input_done_ = true;
        break;
      }
      if (!e) {
        input_done_ = true;
        break;
      }
      in_flight_.push_back(pool_->submit([fn = fn_, x = std::move(*e)]() { return (*fn)(x); }));
    }
    if (in_flight_.empty()) return std::nullopt;
    std::future<Element> f = std::move(in_flight_.front());
    in_flight_.pop_front();
    return f.get();
  }
  int64_t skip_batches(int64_t n) override {
    int64_t done = 0;
    while (done < n && !in_flight_.empty()) {  // computed or computing: drop
      in_flight_.pop_front();
      ++done;
    }
    if (done < n && !input_done_) done += in_->skip_batches(n - done);
    return done;
  }

 private:
  std::shared_ptr<const MapFn> fn_;
  std::unique_ptr<data::DatasetIterator> in_;
  int workers_;
  bool input_done_ = false;
  std::deque<std::future<Element>> in_flight_;
  std::unique_ptr<ThreadPool> pool_;  // started by the first next()
};

class MapNode : public DatasetNode {
 public:
  MapNode(NodePtr input, MapFn fn, int parallel)
      : input_(std::move(input)), fn_(std::make_shared<const MapFn>(std::move(fn))), parallel_(parallel) {}
  std::unique_ptr<data::DatasetIterator> make_iterator(uint64_t key) const override {
    if (parallel_ > 1) return std::make_unique<ParallelMapIterator>(fn_, input_->make_iterator(key), parallel_);
    return std::make_unique<SerialMapIterator>(fn_, input_->make_iterator(key));
  }
  int64_t cardinality() const override { return input_->cardinality(); }

 private:
  NodePtr input_;
  std::shared_ptr<const MapFn> fn_;
  int parallel_;
};

}  // namespace

// --------------------------------------------------------------- factories

NodePtr make_map_node(NodePtr input, MapFn fn, int num_parallel_calls) {
  return std::make_shared<MapNode>(std::move(input), std::move(fn), num_parallel_calls);
}

NodePtr make_shuffle_node(NodePtr input, int64_t buffer_size, uint64_t seed, bool reshuffle) {
  const int64_t c = input->cardinality();
  return std::make_shared<OrderNode<ShuffleOp, ShuffleParams>>(std::move(input),
                                                               ShuffleParams{buffer_size, seed, reshuffle}, c);
}

NodePtr make_batch_node(NodePtr input, int64_t batch_size, bool drop_remainder) {
  return std::make_shared<BatchNode>(std::move(input), batch_size, drop_remainder);
}

NodePtr make_unbatch_node(NodePtr input) { return std::make_shared<UnbatchNode>(std::move(input)); }

NodePtr make_repeat_node(NodePtr input, int64_t count) {
  const int64_t c = input->cardinality();
  int64_t out;
  if (count == 0 || c == 0) {
    out = 0;
  } else if (count < 0 || c == kInfiniteCardinality) {
    out = kInfiniteCardinality;
  } else if (c == kUnknownCardinality) {
    out = kUnknownCardinality;
  } else {
    out = c > kAll / count ? kInfiniteCardinality : c * count;
  }
  return std::make_shared<OrderNode<RepeatOp, RepeatParams>>(std::move(input), RepeatParams{count}, out);
}

NodePtr make_take_node(NodePtr input, int64_t n) {
  const int64_t c = input->cardinality();
  int64_t out;
  if (n < 0) {
    out = c;
  } else if (c == kInfiniteCardinality) {
    out = n;
  } else if (c == kUnknownCardinality) {
    out = n == 0 ? 0 : kUnknownCardinality;
  } else {
    out = std::min(c, n);
  }
  return std::make_shared<OrderNode<TakeOp, TakeParams>>(std::move(input), TakeParams{n}, out);
}

NodePtr make_skip_node(NodePtr input, int64_t n) {
  const int64_t c = input->cardinality();
  int64_t out;
  if (!known(c)) {
    out = c;
  } else if (n < 0) {
    out = 0;
  } else {
    out = std::max<int64_t>(0, c - n);
  }
  return std::make_shared<OrderNode<SkipOp, SkipParams>>(std::move(input), SkipParams{n}, out);
}

NodePtr make_shard_node(NodePtr input, int64_t num_shards, int64_t index) {
  const int64_t c = input->cardinality();
  const int64_t out = known(c) ? c / num_shards + (index < c % num_shards ? 1 : 0) : c;
  return std::make_shared<OrderNode<ShardOp, ShardParams>>(std::move(input), ShardParams{num_shards, index}, out);
}

}  // namespace kiln
