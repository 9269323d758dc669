// Prometheus metrics for the server: counters, gauges and histograms with
// labels, exposed in the text format (version 0.0.4) by expose().
//
//   MetricsRegistry m;
//   m.counter("kiln_requests_total", "Requests", {{"model", "mnist"}, {"protocol", "rest"}}).inc();
//   m.histogram("kiln_request_latency_seconds", "Latency", {{"model", "mnist"}}).observe(0.003);
//   std::string text = m.expose();
//
// Thread-safe: families and series are created under a mutex; updates are
// atomics / a per-series mutex. A series is never removed unless remove()
// is called for it (until then references to it stay valid).
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace kiln::serving {

using Labels = std::map<std::string, std::string>;

class Counter {
 public:
  void inc(double v = 1.0);
  double value() const;

 private:
  std::atomic<double> value_{0.0};
};

class Gauge {
 public:
  void set(double v);
  void add(double v);
  double value() const;

 private:
  std::atomic<double> value_{0.0};
};

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  // Cumulative counts per bound (+Inf last), sum and count.
  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // guarded by mu_; one per bound + overflow
  double sum_ = 0;                // guarded by mu_
  uint64_t count_ = 0;            // guarded by mu_
};

// Latency buckets in seconds (50 us .. 10 s) and batch-size buckets (1 .. 1024).
std::vector<double> latency_buckets();
std::vector<double> batch_size_buckets();

class MetricsRegistry {
 public:
  MetricsRegistry();
  ~MetricsRegistry();
  Counter& counter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge& gauge(const std::string& name, const std::string& help, const Labels& labels = {});
  Histogram& histogram(const std::string& name, const std::string& help, const Labels& labels = {},
                       const std::vector<double>& bounds = latency_buckets());
  // Removes the series `labels` of family `name` (it is no longer exposed;
  // a later counter()/gauge()/histogram() call makes it anew, from zero).
  // A reference to it held elsewhere dangles afterwards: only for series
  // that are looked up on each use. False when there was no such series.
  bool remove(const std::string& name, const Labels& labels);
  // Text exposition format; also samples process_resident_memory_bytes from /proc/self/statm.
  std::string expose() const;

 private:
  struct Family;
  Family& family(const std::string& name, const std::string& help, const char* type);
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<Family>> families_;  // guarded by mu_
};

// Resident set size of this process in bytes (/proc/self/statm), 0 if unknown.
int64_t process_rss_bytes();

// Prometheus label value escaping (\\, \", \n).
std::string escape_label_value(const std::string& v);

}  // namespace kiln::serving
