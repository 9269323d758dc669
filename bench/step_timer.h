// The training benchmarks' step clock: a callback timing each batch of
// fit() after the first two (warm-up).
#pragma once

#include <chrono>

#include "kiln/training/callback.h"

namespace kiln::bench {

class StepTimer : public kiln::callbacks::Callback {
 public:
  void on_train_batch_begin(int64_t batch, const kiln::Logs&) override { t0_ = Clock::now(); }
  void on_train_batch_end(int64_t batch, const kiln::Logs&) override {
    if (batch < 2) return;  // warm-up
    total_ += std::chrono::duration<double>(Clock::now() - t0_).count();
    ++n_;
  }
  double ms_per_step() const { return n_ ? 1e3 * total_ / n_ : 0; }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point t0_;
  double total_ = 0;
  int n_ = 0;
};

}  // namespace kiln::bench
