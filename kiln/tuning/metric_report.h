// Metric reports from external training programs (`kiln tune --command`),
// in the two forms Vertex AI's tuning service and kiln accept:
//
//   stdout line     kiln-metric val_accuracy=0.87 loss=0.41 step=3
//   hypertune file  {"val_accuracy": "0.87", "global_step": "3", "timestamp": 1.7e9}
//
// The hypertune form is what Google's cloudml-hypertune library writes, one
// JSON object per line, to the file named by $CLOUD_ML_HP_METRIC_FILE
// (default /tmp/hypertune/output.metrics); values may be numbers or numeric
// strings; "timestamp", "trial" and "checkpoint_path" are not metrics.
// A report without a step gets the next step after the last one seen
// (StepCounter), so a program that reports once per epoch needs no step.
//
// Malformed lines raise FormatError naming the line and the expected form;
// the trial runner logs them in the trial's stderr.log and goes on.
// Thread safety: functions are pure; HypertuneFileReader is single-threaded.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kiln/training/callback.h"

namespace kiln::tuning {

struct MetricReport {
  std::map<std::string, double> metrics;
  std::optional<int> step;
};

inline constexpr const char* kMetricLinePrefix = "kiln-metric";
inline constexpr const char* kHypertuneFileEnv = "CLOUD_ML_HP_METRIC_FILE";

// nullopt when the line is not a metric line (ordinary program output);
// FormatError when it starts with "kiln-metric" but is malformed.
std::optional<MetricReport> parse_metric_line(const std::string& line);

// The line parse_metric_line reads back exactly: "kiln-metric a=0.5 b=2 step=3"
// (values with enough digits to round-trip a double).
std::string format_metric_line(const std::map<std::string, double>& metrics, int step);

// A training program's side of `kiln tune`: prints each epoch's logs as a
// metric line on stdout, flushed (the tuner prunes on it), step = epoch.
class MetricLineReporter : public callbacks::Callback {
 public:
  void on_epoch_end(int epoch, Logs& logs) override;
};

// nullopt for an empty line; FormatError for anything that is not a JSON
// object of numeric values.
std::optional<MetricReport> parse_hypertune_line(const std::string& line);

// Assigns steps to reports that have none: one more than the last step.
class StepCounter {
 public:
  int assign(const MetricReport& r) {
    last_ = r.step ? *r.step : last_ + 1;
    return last_;
  }

 private:
  int last_ = -1;
};

// Reads the complete lines appended to a hypertune file since the last
// poll (a partial last line waits for its newline). A missing file is empty.
class HypertuneFileReader {
 public:
  explicit HypertuneFileReader(std::string path) : path_(std::move(path)) {}
  // Each complete new line, in order (malformed ones too: parse them).
  std::vector<std::string> poll();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  uint64_t offset_ = 0;
  std::string partial_;
};

}  // namespace kiln::tuning
