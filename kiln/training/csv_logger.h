// CSVLogger: one CSV row per epoch (Keras's keras.callbacks.CSVLogger).
//
//   std::make_shared<CSVLogger>("training.log");  // overwrite
//   std::make_shared<CSVLogger>(CSVLoggerOptions{.filename = "training.log", .separator = ";", .append = true});
//
// Columns: "epoch" (0-based, as Keras writes it) then the log keys sorted
// by name, fixed at the first epoch. When fit() validates but the first
// epoch's logs have no val_ entries (validation_freq > 1), the val_ columns
// are added up front; missing values are written as "NA". Values print
// as Python's repr (shortest round-trip). append=true continues an existing
// file (no second header), so a resumed run (BackupAndRestore) extends it.
// Rows are flushed at each epoch end. Under BackupAndRestore the file's
// length, columns and header state are part of each checkpoint: a resumed
// run cuts the rows written after the checkpoint (their epochs run again)
// and continues the same file, so it ends as an uninterrupted run's would,
// whatever `append` says.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "kiln/layers/layer_holder.h"
#include "kiln/training/callback.h"

namespace kiln {

namespace callbacks {

struct CSVLoggerOptions {
  std::string filename;  // required
  std::string separator = ",";
  bool append = false;
};

class CSVLoggerImpl : public Callback {
 public:
  explicit CSVLoggerImpl(CSVLoggerOptions options);
  explicit CSVLoggerImpl(std::string filename) : CSVLoggerImpl(CSVLoggerOptions{.filename = std::move(filename)}) {}
  ~CSVLoggerImpl() override;

  void on_train_begin(const Logs& logs) override;
  void on_epoch_end(int epoch, Logs& logs) override;
  void on_train_end(const Logs& logs) override;

  // columns, header written, file length in bytes.
  Json get_state() const override;
  void set_state(const Json& state) override;
  std::string state_name() const override { return "CSVLogger"; }

 private:
  void close();
  std::string filename_;
  std::string sep_;
  bool append_;
  bool write_header_ = true;
  std::FILE* file_ = nullptr;
  std::vector<std::string> keys_;
  int64_t bytes_ = 0;  // file length after the last row written
};
KILN_LAYER_HOLDER(CSVLogger, CSVLoggerOptions);

}  // namespace callbacks

}  // namespace kiln

#define KILN_LEGACY_CALLBACKS_CSV_LOGGER_H
#include "kiln/training/legacy_names.h"
