// prefetch(): a producer thread fills a bounded queue ahead of the consumer.
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "kiln/data/dataset_node.h"

namespace kiln {
namespace {

// The producer starts at the first next() (so skip_batches() before it goes
// straight to the input), stops when the queue holds `capacity` elements, and
// ends at the input's end or its first exception, which next() rethrows after
// the elements produced before it. The destructor wakes and joins it; a
// producer blocked inside the input's next() (a generator that never
// returns) is waited for. ATen ops on the producer run single-threaded
// (use_one_intra_op_thread_here), so the producer costs at most one core.
class PrefetchIterator : public DatasetIterator {
 public:
  PrefetchIterator(std::unique_ptr<DatasetIterator> in, int64_t capacity)
      : in_(std::move(in)), capacity_(static_cast<size_t>(capacity)) {}

  ~PrefetchIterator() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  std::optional<Element> next() override {
    if (!thread_.joinable()) thread_ = std::thread([this] { produce(); });
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return !queue_.empty() || producer_done_; });
    if (!queue_.empty()) {
      Element e = std::move(queue_.front());
      queue_.pop_front();
      l.unlock();
      cv_.notify_all();
      return e;
    }
    if (error_) {
      std::exception_ptr e = error_;
      error_ = nullptr;  // once; later calls report the end
      std::rethrow_exception(e);
    }
    return std::nullopt;
  }

  int64_t skip_batches(int64_t n) override {
    if (!thread_.joinable()) return in_->skip_batches(n);
    int64_t done = 0;
    while (done < n && next()) ++done;
    return done;
  }

 private:
  void produce() {
    use_one_intra_op_thread_here();
    for (;;) {
      {
        std::lock_guard<std::mutex> l(mu_);
        if (stop_) break;
      }
      std::optional<Element> e;
      try {
        e = in_->next();
      } catch (...) {
        std::lock_guard<std::mutex> l(mu_);
        error_ = std::current_exception();
        break;
      }
      if (!e) break;
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || queue_.size() < capacity_; });
      if (stop_) break;
      queue_.push_back(std::move(*e));
      l.unlock();
      cv_.notify_all();
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      producer_done_ = true;
    }
    cv_.notify_all();
  }

  std::unique_ptr<DatasetIterator> in_;  // used by the producer once it runs
  const size_t capacity_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Element> queue_;      // guarded by mu_
  bool producer_done_ = false;     // guarded by mu_
  bool stop_ = false;              // guarded by mu_
  std::exception_ptr error_;       // guarded by mu_
  std::thread thread_;             // last: joined before the rest goes
};

class PrefetchNode : public DatasetNode {
 public:
  PrefetchNode(NodePtr input, int64_t capacity) : input_(std::move(input)), capacity_(capacity) {}
  std::unique_ptr<DatasetIterator> make_iterator(uint64_t key) const override {
    return std::make_unique<PrefetchIterator>(input_->make_iterator(key), capacity_);
  }
  int64_t cardinality() const override { return input_->cardinality(); }

 private:
  NodePtr input_;
  int64_t capacity_;
};

}  // namespace

NodePtr make_prefetch_node(NodePtr input, int64_t buffer_size) {
  return std::make_shared<PrefetchNode>(input, buffer_size);
}

}  // namespace kiln
