// prefetch(): a producer thread fills a bounded queue ahead of the consumer.
#include <ATen/Parallel.h>

#include <chrono>
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
class PrefetchIterator : public data::DatasetIterator {
 public:
  PrefetchIterator(std::unique_ptr<data::DatasetIterator> in, int64_t capacity)
      : in_(std::move(in)), capacity_(static_cast<size_t>(capacity)) {}

  ~PrefetchIterator() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    space_cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  std::optional<Element> next() override {
    if (!thread_.joinable()) thread_ = std::thread([this] { produce(); });
    std::unique_lock<std::mutex> l(mu_);
    if (queue_.empty() && !producer_done_) {
      // About to block anyway: cut a polling producer's sleep short.
      if (producer_wait_ != ProducerWait::kNone) space_cv_.notify_one();
      consumer_waiting_ = true;
      item_cv_.wait(l, [&] { return !queue_.empty() || producer_done_; });
      consumer_waiting_ = false;
    }
    if (!queue_.empty()) {
      Element e = std::move(queue_.front());
      queue_.pop_front();
      const bool wake = producer_wait_ == ProducerWait::kBlocked;
      l.unlock();
      if (wake) space_cv_.notify_one();
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
      if (!wait_for_room(l)) break;
      queue_.push_back(std::move(*e));
      const bool wake = consumer_waiting_;
      l.unlock();
      if (wake) item_cv_.notify_one();
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      producer_done_ = true;
    }
    item_cv_.notify_all();
  }

  // Waits until the queue has room; false when stopped. While the queue is
  // full the producer polls on a timer (20 us, doubling to 250 us) for the
  // first 50 ms, and only then blocks until next() signals (next() also
  // wakes a polling producer when it finds the queue empty). Why: a wake-up
  // sent by next() costs the consumer a futex call and an inter-processor
  // interrupt, and the scheduler may pull the producer onto the consumer's
  // core; on this project's 2-vCPU VM that measured 30-55 us per batch (an
  // MLP epoch 1.16-1.23x its in-memory time, against 0.93-1.01x polling).
  // Timer wake-ups on the producer's own core cost the consumer nothing; the
  // 50 ms limit keeps an idle iterator (a paused training loop) from polling.
  bool wait_for_room(std::unique_lock<std::mutex>& l) {
    using namespace std::chrono;
    const auto give_up = steady_clock::now() + milliseconds(50);
    auto interval = microseconds(20);
    while (!stop_ && queue_.size() >= capacity_) {
      if (steady_clock::now() < give_up) {
        producer_wait_ = ProducerWait::kPolling;
        space_cv_.wait_for(l, interval);
        interval = std::min<microseconds>(interval * 2, microseconds(250));
      } else {
        producer_wait_ = ProducerWait::kBlocked;
        space_cv_.wait(l, [&] { return stop_ || queue_.size() < capacity_; });
      }
    }
    producer_wait_ = ProducerWait::kNone;
    return !stop_;
  }

  std::unique_ptr<data::DatasetIterator> in_;  // used by the producer once it runs
  const size_t capacity_;
  std::mutex mu_;
  std::condition_variable item_cv_;   // consumer waits for an element
  std::condition_variable space_cv_;  // producer waits for room (or stop)
  bool consumer_waiting_ = false;     // guarded by mu_
  enum class ProducerWait { kNone, kPolling, kBlocked };
  ProducerWait producer_wait_ = ProducerWait::kNone;  // guarded by mu_
  std::deque<Element> queue_;                         // guarded by mu_
  bool producer_done_ = false;                        // guarded by mu_
  bool stop_ = false;                                 // guarded by mu_
  std::exception_ptr error_;                          // guarded by mu_
  std::thread thread_;                                // last: joined before the rest goes
};

bool spare_core() {
  const unsigned cores = std::thread::hardware_concurrency();
  return cores == 0 || at::get_num_threads() < static_cast<int>(cores);
}

class PrefetchNode : public DatasetNode {
 public:
  PrefetchNode(NodePtr input, int64_t capacity) : input_(std::move(input)), capacity_(capacity) {}
  std::unique_ptr<data::DatasetIterator> make_iterator(uint64_t key) const override {
    // An in-memory input never waits on I/O, so a producer thread only helps
    // by running on a core the caller's own threads leave idle. When ATen's
    // intra-op threads already cover every core, it would take cycles from
    // the training step instead (an MLP epoch on 2 cores: 1.10-1.2x with the
    // thread, 1.01x gathering in next() with the caller's idle OpenMP team),
    // so the elements are produced in next() then.
    if (input_->in_memory() && !spare_core()) return input_->make_iterator(key);
    return std::make_unique<PrefetchIterator>(input_->make_iterator(key), capacity_);
  }
  int64_t cardinality() const override { return input_->cardinality(); }
  bool in_memory() const override { return input_->in_memory(); }

 private:
  NodePtr input_;
  int64_t capacity_;
};

}  // namespace

NodePtr make_prefetch_node(NodePtr input, int64_t buffer_size) {
  return std::make_shared<PrefetchNode>(input, buffer_size);
}

}  // namespace kiln
