#include "kiln/serving/metrics.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "kiln/core/error.h"

namespace kiln::serving {
namespace {

void atomic_add(std::atomic<double>& a, double v) {
  double cur = a.load(std::memory_order_relaxed);
  while (!a.compare_exchange_weak(cur, cur + v, std::memory_order_relaxed)) {
  }
}

std::string fmt(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string label_str(const Labels& labels, const std::string& extra_key = "", const std::string& extra_value = "") {
  std::string s;
  for (auto& [k, v] : labels) s += (s.empty() ? "" : ",") + k + "=\"" + escape_label_value(v) + "\"";
  if (!extra_key.empty()) s += (s.empty() ? "" : ",") + extra_key + "=\"" + extra_value + "\"";
  return s.empty() ? "" : "{" + s + "}";
}

}  // namespace

void Counter::inc(double v) { atomic_add(value_, v); }
double Counter::value() const { return value_.load(); }
void Gauge::set(double v) { value_.store(v); }
void Gauge::add(double v) { atomic_add(value_, v); }
double Gauge::value() const { return value_.load(); }

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  std::lock_guard<std::mutex> l(mu_);
  ++counts_[i];
  sum_ += v;
  ++count_;
}

Histogram::Snapshot Histogram::snapshot() const {
  std::lock_guard<std::mutex> l(mu_);
  Snapshot s;
  s.bounds = bounds_;
  uint64_t c = 0;
  for (auto n : counts_) s.cumulative.push_back(c += n);
  s.sum = sum_;
  s.count = count_;
  return s;
}

std::vector<double> latency_buckets() {
  return {5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
}
std::vector<double> batch_size_buckets() { return {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}; }

struct MetricsRegistry::Family {
  std::string name, help, type;
  std::vector<double> bounds;
  std::map<Labels, std::unique_ptr<Counter>> counters;
  std::map<Labels, std::unique_ptr<Gauge>> gauges;
  std::map<Labels, std::unique_ptr<Histogram>> histograms;
};

MetricsRegistry::MetricsRegistry() = default;
MetricsRegistry::~MetricsRegistry() = default;

MetricsRegistry::Family& MetricsRegistry::family(const std::string& name, const std::string& help, const char* type) {
  auto& f = families_[name];
  if (!f) {
    f = std::make_unique<Family>();
    f->name = name;
    f->help = help;
    f->type = type;
  } else if (f->type != type) {
    throw ValueError("metric '" + name + "' is a " + f->type + ", not a " + type);
  }
  return *f;
}

Counter& MetricsRegistry::counter(const std::string& name, const std::string& help, const Labels& labels) {
  std::lock_guard<std::mutex> l(mu_);
  auto& p = family(name, help, "counter").counters[labels];
  if (!p) p = std::make_unique<Counter>();
  return *p;
}

Gauge& MetricsRegistry::gauge(const std::string& name, const std::string& help, const Labels& labels) {
  std::lock_guard<std::mutex> l(mu_);
  auto& p = family(name, help, "gauge").gauges[labels];
  if (!p) p = std::make_unique<Gauge>();
  return *p;
}

Histogram& MetricsRegistry::histogram(const std::string& name, const std::string& help, const Labels& labels,
                                      const std::vector<double>& bounds) {
  std::lock_guard<std::mutex> l(mu_);
  auto& p = family(name, help, "histogram").histograms[labels];
  if (!p) p = std::make_unique<Histogram>(bounds);
  return *p;
}

bool MetricsRegistry::remove(const std::string& name, const Labels& labels) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = families_.find(name);
  if (it == families_.end()) return false;
  Family& f = *it->second;
  const bool removed = f.counters.erase(labels) + f.gauges.erase(labels) + f.histograms.erase(labels) > 0;
  if (f.counters.empty() && f.gauges.empty() && f.histograms.empty()) families_.erase(it);  // no empty HELP/TYPE
  return removed;
}

std::string MetricsRegistry::expose() const {
  std::ostringstream o;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& [name, f] : families_) {
      o << "# HELP " << name << " " << f->help << "\n# TYPE " << name << " " << f->type << "\n";
      for (auto& [labels, c] : f->counters) o << name << label_str(labels) << " " << fmt(c->value()) << "\n";
      for (auto& [labels, g] : f->gauges) o << name << label_str(labels) << " " << fmt(g->value()) << "\n";
      for (auto& [labels, h] : f->histograms) {
        auto s = h->snapshot();
        for (size_t i = 0; i <= s.bounds.size(); ++i)
          o << name << "_bucket" << label_str(labels, "le", i < s.bounds.size() ? fmt(s.bounds[i]) : "+Inf") << " "
            << s.cumulative[i] << "\n";
        o << name << "_sum" << label_str(labels) << " " << fmt(s.sum) << "\n";
        o << name << "_count" << label_str(labels) << " " << s.count << "\n";
      }
    }
  }
  o << "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
    << "# TYPE process_resident_memory_bytes gauge\n"
    << "process_resident_memory_bytes " << process_rss_bytes() << "\n";
  return o.str();
}

int64_t process_rss_bytes() {
  std::ifstream in("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(in >> size >> resident)) return 0;
  return resident * (int64_t)sysconf(_SC_PAGESIZE);
}

std::string escape_label_value(const std::string& v) {
  std::string s;
  for (char c : v) {
    if (c == '\\')
      s += "\\\\";
    else if (c == '"')
      s += "\\\"";
    else if (c == '\n')
      s += "\\n";
    else
      s += c;
  }
  return s;
}

}  // namespace kiln::serving
