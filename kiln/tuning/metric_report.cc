#include "kiln/tuning/metric_report.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

#include "kiln/core/error.h"
#include "kiln/core/json.h"
#include "kiln/core/json_limits.h"

namespace kiln::tuning {
namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

// A whole-string double ("0.5", "1e-3", "nan"); nullopt otherwise.
std::optional<double> to_double(const std::string& s) {
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || errno == ERANGE) return std::nullopt;
  return v;
}

std::optional<int> to_step(double v) {
  if (!std::isfinite(v) || v < 0 || v != std::floor(v) || v > 1e9) return std::nullopt;
  return (int)v;
}

}  // namespace

std::string format_metric_line(const std::map<std::string, double>& metrics, int step) {
  std::ostringstream os;
  os.precision(17);
  os << kMetricLinePrefix;
  for (auto& [k, v] : metrics) os << " " << k << "=" << v;
  os << " step=" << step;
  return os.str();
}

void MetricLineReporter::on_epoch_end(int epoch, Logs& logs) {
  std::cout << format_metric_line(logs, epoch) << std::endl;
}

std::optional<MetricReport> parse_metric_line(const std::string& raw) {
  std::string line = trim(raw);
  const std::string prefix = kMetricLinePrefix;
  if (line.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  if (line.size() > prefix.size() && line[prefix.size()] != ' ' && line[prefix.size()] != '\t')
    return std::nullopt;  // "kiln-metrics..." is ordinary output
  auto bad = [&](const std::string& why) {
    return FormatError("malformed metric line " + text_excerpt(line, 120) + ": " + why +
                       "; expected \"kiln-metric NAME=VALUE [NAME=VALUE...] [step=N]\"");
  };
  std::istringstream in(line.substr(prefix.size()));
  MetricReport r;
  std::string tok;
  while (in >> tok) {
    auto eq = tok.find('=');
    if (eq == std::string::npos || eq == 0) throw bad("'" + tok + "' is not NAME=VALUE");
    std::string name = tok.substr(0, eq);
    auto v = to_double(tok.substr(eq + 1));
    if (!v) throw bad("the value of '" + name + "' is not a number");
    if (name == "step" || name == "global_step" || name == "epoch") {
      auto s = to_step(*v);
      if (!s) throw bad("step must be a non-negative integer");
      r.step = s;
    } else {
      r.metrics[name] = *v;
    }
  }
  if (r.metrics.empty()) throw bad("no metric");
  return r;
}

std::optional<MetricReport> parse_hypertune_line(const std::string& raw) {
  std::string line = trim(raw);
  if (line.empty()) return std::nullopt;
  auto bad = [&](const std::string& why) {
    return FormatError("malformed hypertune metrics line " + text_excerpt(line, 120) + ": " + why +
                       "; expected a JSON object such as {\"val_accuracy\": 0.9, \"global_step\": 3}");
  };
  Json j;
  if (json_depth(line) > kMaxJsonDepth) throw bad("nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  try {
    j = Json::parse(line);
  } catch (const std::exception&) {
    throw bad("not valid JSON");
  }
  if (!j.is_object()) throw bad("not a JSON object");
  MetricReport r;
  for (auto& [k, v] : j.items()) {
    if (k == "timestamp" || k == "trial" || k == "checkpoint_path") continue;
    std::optional<double> d;
    if (v.is_number())
      d = v.get<double>();
    else if (v.is_string())
      d = to_double(v.get<std::string>());
    if (!d) throw bad("the value of \"" + k + "\" is not a number");
    if (k == "global_step" || k == "step" || k == "epoch") {
      auto s = to_step(*d);
      if (!s) throw bad("global_step must be a non-negative integer");
      r.step = s;
    } else {
      r.metrics[k] = *d;
    }
  }
  if (r.metrics.empty()) throw bad("no metric");
  return r;
}

std::vector<std::string> HypertuneFileReader::poll() {
  std::vector<std::string> lines;
  std::ifstream f(path_, std::ios::binary);
  if (!f) return lines;
  f.seekg(0, std::ios::end);
  auto size = (uint64_t)f.tellg();
  if (size < offset_) {  // truncated or replaced: start over
    offset_ = 0;
    partial_.clear();
  }
  if (size == offset_) return lines;
  f.seekg((std::streamoff)offset_);
  std::string chunk(size - offset_, '\0');
  f.read(chunk.data(), (std::streamsize)chunk.size());
  chunk.resize((size_t)f.gcount());
  offset_ += chunk.size();
  partial_ += chunk;
  size_t start = 0, nl;
  while ((nl = partial_.find('\n', start)) != std::string::npos) {
    lines.push_back(partial_.substr(start, nl - start));
    start = nl + 1;
  }
  partial_.erase(0, start);
  return lines;
}

}  // namespace kiln::tuning
