#include "kiln/training/progbar.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <set>

#include "kiln/models/model.h"
#include "kiln/training/train_state.h"

namespace kiln {
namespace {

std::string printf_string(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

int num_digits(int64_t n) { return n <= 0 ? 1 : (int)std::floor(std::log10((double)n)) + 1; }

std::string count_text(int64_t current, int64_t target) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%*lld/%lld", num_digits(target), (long long)current, (long long)target);
  return buf;
}

std::string eta_text(double eta) {
  char buf[64];
  long long e = (long long)eta;
  if (eta > 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", e / 3600, (e % 3600) / 60, e % 60);
  else if (eta > 60)
    std::snprintf(buf, sizeof buf, "%lld:%02lld", e / 60, e % 60);
  else
    std::snprintf(buf, sizeof buf, "%llds", e);
  return buf;
}

}  // namespace

bool stdout_is_terminal() { return ::isatty(STDOUT_FILENO) == 1; }

Progbar::Progbar(int64_t target, int verbose, std::ostream& os, const std::string& unit_name, int dynamic)
    : target_(target), verbose_(verbose), os_(os), unit_(unit_name) {
  dynamic_ = dynamic < 0 ? (&os == &std::cout && stdout_is_terminal()) : dynamic != 0;
  start_ = last_update_ = Clock::now();
}

std::string Progbar::format_time(double t, const std::string& unit) {
  if (t >= 1 || t == 0) return printf_string(" %.0fs/", t) + unit;
  if (t >= 1e-3) return printf_string(" %.0fms/", t * 1e3) + unit;
  return printf_string(" %.0fus/", t * 1e6) + unit;
}

std::string Progbar::format_value(double v) {
  return std::fabs(v) > 1e-3 ? printf_string("%.4f", v) : printf_string("%.4e", v);
}

void Progbar::update(int64_t current, const std::vector<std::pair<std::string, double>>& values, bool finalize) {
  const auto now = Clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double per_unit = current > 0 ? elapsed / (double)current : 0.0;
  std::string metrics;
  for (auto& [k, v] : values) metrics += " - " + k + ": " + format_value(v);

  if (verbose_ == 1) {
    if (!finalize && updated_ && std::chrono::duration<double>(now - last_update_).count() < 0.05) return;
    updated_ = true;
    last_update_ = now;
    std::string bar;
    size_t visible = 0;  // printable width (escape codes excluded)
    if (target_ > 0) {
      std::string count = count_text(current, target_);
      const int width = 20;
      int done = (int)(width * std::min<double>(1.0, (double)current / (double)target_));
      std::string filled, empty;
      for (int i = 0; i < done; ++i) filled += "\xe2\x94\x81";  // U+2501, Keras 3's bar
      for (int i = done; i < width; ++i) empty += "\xe2\x94\x81";
      if (dynamic_) {
        bar = "\x1b[1m" + count + "\x1b[0m ";
        if (done > 0) bar += "\x1b[32m" + filled + "\x1b[0m";
        if (done < width) bar += "\x1b[37m" + empty + "\x1b[0m";
      } else {
        bar = count + " [" + std::string(done, '=') + std::string(width - done, '.') + "]";
      }
      visible = count.size() + 1 + width + (dynamic_ ? 0 : 2);
    } else {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%7lld/Unknown", (long long)current);
      bar = buf;
      visible = bar.size();
    }
    std::string info;
    if (target_ > 0 && !finalize)
      info = " " + eta_text(per_unit * (double)(target_ - current));
    else
      info = printf_string(" %.0fs", elapsed);
    info += format_time(per_unit, unit_) + metrics;
    size_t width = visible + info.size();
    std::string line = (dynamic_ ? "\r" : "") + bar + info;
    if (dynamic_ && prev_width_ > width) line += std::string(prev_width_ - width, ' ');
    prev_width_ = width;
    if (finalize || !dynamic_) line += "\n";
    os_ << line << std::flush;
  } else if (verbose_ == 2 && finalize) {
    const int64_t target = target_ > 0 ? target_ : current;
    os_ << count_text(current, target) << printf_string(" - %.0fs", elapsed) << " -" << format_time(per_unit, unit_)
        << metrics << "\n"
        << std::flush;
  }
}

// --- ProgbarLogger -----------------------------------------------------------

callbacks::ProgbarLoggerImpl::ProgbarLoggerImpl(int verbose, std::ostream* os, int dynamic)
    : verbose_(verbose), os_(os ? os : &std::cout), dynamic_(dynamic) {}

int callbacks::ProgbarLoggerImpl::verbose() const {
  if (verbose_ >= 0) return verbose_;
  int v = params().value("verbose", 1);
  return v < 0 ? (stdout_is_terminal() ? 1 : 2) : v;
}

int64_t callbacks::ProgbarLoggerImpl::target() const {
  if (params().contains("steps") && params()["steps"].is_number_integer()) {
    int64_t s = params()["steps"].get<int64_t>();
    if (s > 0) return s;
  }
  return known_target_;
}

std::vector<std::pair<std::string, double>> callbacks::ProgbarLoggerImpl::ordered(const Logs& logs) {
  std::vector<std::string> names;
  if (has_model() && model().compiled())
    names = model().train_state().metric_names();
  else
    names = {"loss"};
  std::vector<std::pair<std::string, double>> out;
  std::set<std::string> used;
  auto take = [&](const std::string& k) {
    auto it = logs.find(k);
    if (it != logs.end() && used.insert(k).second) out.emplace_back(k, it->second);
  };
  for (auto& n : names) take(n);
  for (auto& n : names) take("val_" + n);
  for (auto& [k, v] : logs) take(k);
  return out;
}

void callbacks::ProgbarLoggerImpl::reset() {
  seen_ = 0;
  bar_.reset();
}

void callbacks::ProgbarLoggerImpl::update(int64_t batch, const Logs& logs) {
  if (verbose() == 0) return;
  if (!bar_) bar_ = std::make_unique<Progbar>(target(), verbose(), *os_, "step", dynamic_);
  seen_ = batch + 1;
  if (verbose() == 1) bar_->update(seen_, ordered(logs), false);
}

void callbacks::ProgbarLoggerImpl::finalize(const Logs& logs) {
  if (verbose() == 0) return;
  if (!bar_) bar_ = std::make_unique<Progbar>(target(), verbose(), *os_, "step", dynamic_);
  int64_t t = target();
  if (t <= 0) {
    known_target_ = t = seen_;
    bar_->set_target(t);
  }
  bar_->update(t, ordered(logs), true);
}

void callbacks::ProgbarLoggerImpl::on_train_begin(const Logs&) {
  in_fit_ = true;
  known_target_ = -1;
}

void callbacks::ProgbarLoggerImpl::on_epoch_begin(int epoch, const Logs&) {
  reset();
  int epochs = params().value("epochs", 1);
  if (verbose() != 0 && epochs > 1) *os_ << "Epoch " << epoch + 1 << "/" << epochs << "\n" << std::flush;
}

void callbacks::ProgbarLoggerImpl::on_train_batch_end(int64_t batch, const Logs& logs) { update(batch, logs); }
void callbacks::ProgbarLoggerImpl::on_epoch_end(int, Logs& logs) { finalize(logs); }

void callbacks::ProgbarLoggerImpl::on_test_begin(const Logs&) {
  if (!in_fit_) reset();
}
void callbacks::ProgbarLoggerImpl::on_test_batch_end(int64_t batch, const Logs& logs) {
  if (!in_fit_) update(batch, logs);
}
void callbacks::ProgbarLoggerImpl::on_test_end(const Logs& logs) {
  if (!in_fit_) finalize(logs);
}

void callbacks::ProgbarLoggerImpl::on_predict_begin(const Logs&) { reset(); }
void callbacks::ProgbarLoggerImpl::on_predict_batch_end(int64_t batch, const Logs&) { update(batch, {}); }
void callbacks::ProgbarLoggerImpl::on_predict_end(const Logs&) { finalize({}); }

}  // namespace kiln
