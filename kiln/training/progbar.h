// Progress output, as Keras prints it.
//
// Progbar draws one progress line (Keras's keras.utils.Progbar):
//   verbose 1, terminal:  a live bar redrawn with '\r'
//       " 12/469 ━━━━━━━━━━━━━━━━━━━━ 3s 8ms/step - loss: 0.6012 - accuracy: 0.7800"
//   verbose 2 (or not a terminal): one line when the pass finishes
//       "469/469 - 2s - 4ms/step - loss: 0.5123 - accuracy: 0.8234"
// Values print with 4 decimals, or in scientific notation when |v| <= 1e-3.
//
// ProgbarLogger is the callback fit()/evaluate()/predict() add when
// verbose != 0: "Epoch 3/10" before each epoch (when epochs > 1), then the
// bar (verbose 1) or the epoch's line with train and val_ values (verbose 2).
// Keys print as Keras orders them: loss, the compiled metrics, their val_
// counterparts, then any other entries (learning_rate).
//
// Thread safety: none (one training loop).
#pragma once

#include <chrono>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "kiln/layers/layer_holder.h"
#include "kiln/training/callback.h"

namespace kiln {

class Progbar {
 public:
  // target: total steps, or -1 if unknown. verbose: 1 live bar, 2 one line
  // at the end. dynamic: redraw in place ('\r'); by default when `os` is
  // std::cout and stdout is a terminal.
  Progbar(int64_t target, int verbose, std::ostream& os = std::cout, const std::string& unit_name = "step",
          int dynamic = -1);

  // `current` steps are done; values are printed in the given order.
  void update(int64_t current, const std::vector<std::pair<std::string, double>>& values, bool finalize = false);
  void set_target(int64_t target) { target_ = target; }

  // " 4ms/step" (Keras's _format_time).
  static std::string format_time(double seconds_per_unit, const std::string& unit);
  // "0.5123" or "1.2300e-04".
  static std::string format_value(double v);

 private:
  using Clock = std::chrono::steady_clock;
  int64_t target_;
  int verbose_;
  std::ostream& os_;
  std::string unit_;
  bool dynamic_;
  Clock::time_point start_;
  Clock::time_point last_update_;
  bool updated_ = false;
  size_t prev_width_ = 0;
};

// True when stdout is a terminal.
bool stdout_is_terminal();

namespace callbacks {

class ProgbarLoggerImpl : public Callback {
 public:
  // verbose -1: take fit()'s (params()["verbose"]). os: where to print.
  // dynamic: see Progbar (-1: auto).
  explicit ProgbarLoggerImpl(int verbose = -1, std::ostream* os = nullptr, int dynamic = -1);

  void on_train_begin(const Logs& logs) override;
  void on_epoch_begin(int epoch, const Logs& logs) override;
  void on_train_batch_end(int64_t batch, const Logs& logs) override;
  void on_epoch_end(int epoch, Logs& logs) override;
  void on_test_begin(const Logs& logs) override;
  void on_test_batch_end(int64_t batch, const Logs& logs) override;
  void on_test_end(const Logs& logs) override;
  void on_predict_begin(const Logs& logs) override;
  void on_predict_batch_end(int64_t batch, const Logs& logs) override;
  void on_predict_end(const Logs& logs) override;

 private:
  int verbose() const;
  int64_t target() const;
  std::vector<std::pair<std::string, double>> ordered(const Logs& logs);
  void reset();
  void update(int64_t batch, const Logs& logs);
  void finalize(const Logs& logs);

  int verbose_;
  std::ostream* os_;
  int dynamic_;
  bool in_fit_ = false;
  int64_t seen_ = 0;
  int64_t known_target_ = -1;  // learnt from the first epoch when steps is unknown
  std::unique_ptr<Progbar> bar_;
};
KILN_LAYER_HOLDER(ProgbarLogger, void);

}  // namespace callbacks

}  // namespace kiln

#define KILN_LEGACY_CALLBACKS_PROGBAR_H
#include "kiln/training/legacy_names.h"
