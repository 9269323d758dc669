// SaveFreq: Keras's `save_freq` argument — "epoch" or a number of batches.
//   ModelCheckpoint("ckpt/{epoch:02d}", {.save_freq = "epoch"});
//   BackupAndRestore("backup", {.save_freq = 100});   // every 100 batches
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "kiln/core/error.h"

namespace kiln {

class SaveFreq {
 public:
  SaveFreq() = default;  // "epoch"
  SaveFreq(const char* s) : SaveFreq(std::string(s)) {}
  SaveFreq(const std::string& s) {
    if (s != "epoch")
      throw ValueError("save_freq must be \"epoch\" or a positive number of batches. Received: save_freq=\"" + s +
                       "\"");
  }
  SaveFreq(int batches) : SaveFreq(static_cast<int64_t>(batches)) {}
  SaveFreq(int64_t batches) : batches_(batches) {
    if (batches <= 0)
      throw ValueError("save_freq must be \"epoch\" or a positive number of batches. Received: save_freq=" +
                       std::to_string(batches));
  }
  bool per_epoch() const { return batches_ == 0; }
  int64_t batches() const { return batches_; }  // 0 when per epoch
  std::string to_string() const { return per_epoch() ? "epoch" : std::to_string(batches_); }

 private:
  int64_t batches_ = 0;
};

// Counts batches across epochs and says when `freq` of them have passed
// since the last save (Keras's _should_save_on_batch).
class BatchCounter {
 public:
  bool should_save(int64_t batch, int64_t freq) {
    int64_t add = batch <= last_batch_ ? batch + 1 : batch - last_batch_;  // new epoch: restart
    since_save_ += add;
    last_batch_ = batch;
    if (since_save_ >= freq) {
      since_save_ = 0;
      return true;
    }
    return false;
  }
  void reset() { last_batch_ = -1, since_save_ = 0; }
  // The next batch seen will be `batch` of the current epoch (a resumed run).
  void start_at(int64_t batch) { last_batch_ = batch - 1, since_save_ = 0; }
  // For callback state (Callback::get_state).
  std::pair<int64_t, int64_t> state() const { return {last_batch_, since_save_}; }
  void set_state(int64_t last_batch, int64_t since_save) { last_batch_ = last_batch, since_save_ = since_save; }

 private:
  int64_t last_batch_ = -1;
  int64_t since_save_ = 0;
};

}  // namespace kiln
