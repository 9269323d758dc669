// CSVLogger: one CSV row per epoch (Keras's keras.callbacks.CSVLogger).
//
//   std::make_shared<CSVLogger>("training.log");          // overwrite
//   std::make_shared<CSVLogger>("training.log", ";", true);  // append
//
// Columns: "epoch" (0-based, as Keras writes it) then the log keys sorted
// by name, fixed at the first epoch. When fit() validates but the first
// epoch's logs have no val_ entries (validation_freq > 1), the val_ columns
// are added up front; missing values are written as "NA". Values print
// as Python's repr (shortest round-trip). append=true continues an existing
// file (no second header), so a resumed run (BackupAndRestore) extends it.
// Rows are flushed at each epoch end.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "kiln/training/callback.h"

namespace kiln {

class CSVLogger : public Callback {
 public:
  explicit CSVLogger(std::string filename, std::string separator = ",", bool append = false);
  ~CSVLogger() override;

  void on_train_begin(const Logs& logs) override;
  void on_epoch_end(int epoch, Logs& logs) override;
  void on_train_end(const Logs& logs) override;

 private:
  void close();
  std::string filename_;
  std::string sep_;
  bool append_;
  bool write_header_ = true;
  std::FILE* file_ = nullptr;
  std::vector<std::string> keys_;
};

}  // namespace kiln
