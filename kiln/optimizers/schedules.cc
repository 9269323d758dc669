#include "kiln/optimizers/schedules.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "kiln/core/config_keys.h"
#include "kiln/core/error.h"
#include "kiln/core/json_limits.h"

namespace kiln {
namespace {

void check_schedule_keys(const Json& c, const std::vector<std::string>& allowed, const std::string& owner) {
  if (c.is_null()) return;
  check_config_keys(c, allowed, owner + " config");
}

void check_decay_steps(int64_t decay_steps, const std::string& owner) {
  if (decay_steps <= 0)
    throw ValueError(owner +
                     ": argument `decay_steps` must be > 0. Received: decay_steps=" + std::to_string(decay_steps));
}

double required_number(const Json& c, const char* key, const std::string& owner) {
  const Json& v = require(c, key, owner);
  if (!v.is_number())
    throw ValueError(owner + ": `" + key + "` must be a number. Received: " + key + "=" + json_excerpt(v));
  return v.get<double>();
}

}  // namespace

std::shared_ptr<LearningRateSchedule> LearningRateSchedule::from_json(const Json& j) {
  if (!j.is_object() || !j.contains("class_name") || !j["class_name"].is_string())
    throw ValueError("A learning-rate schedule must be {\"class_name\": ..., \"config\": {...}}. Received: " +
                     json_excerpt(j));
  const std::string cls = j["class_name"].get<std::string>();
  const Json config = j.contains("config") ? j["config"] : Json::object();
  if (cls == "ExponentialDecay") return optimizers::ExponentialDecay::from_config(config);
  if (cls == "CosineDecay") return optimizers::CosineDecay::from_config(config);
  if (cls == "PiecewiseConstantDecay") return optimizers::PiecewiseConstantDecay::from_config(config);
  if (cls == "PolynomialDecay") return optimizers::PolynomialDecay::from_config(config);
  if (cls == "InverseTimeDecay") return optimizers::InverseTimeDecay::from_config(config);
  if (cls == "CosineDecayRestarts") return optimizers::CosineDecayRestarts::from_config(config);
  throw ValueError("Unknown learning-rate schedule '" + cls +
                   "'. Known schedules: ExponentialDecay, CosineDecay, PiecewiseConstantDecay, PolynomialDecay, "
                   "InverseTimeDecay, CosineDecayRestarts");
}

namespace optimizers {

// --- ExponentialDecay -------------------------------------------------------------------

ExponentialDecay::ExponentialDecay(const ExponentialDecayOptions& o)
    : initial_learning_rate_(o.initial_learning_rate),
      decay_steps_(o.decay_steps),
      decay_rate_(o.decay_rate),
      staircase_(o.staircase),
      name_(o.name) {
  check_decay_steps(decay_steps_, "ExponentialDecay");
}

std::shared_ptr<ExponentialDecay> ExponentialDecay::from_config(const Json& c) {
  check_schedule_keys(c, {"initial_learning_rate", "decay_steps", "decay_rate", "staircase", "name"},
                      "ExponentialDecay");
  return std::make_shared<ExponentialDecay>(ExponentialDecayOptions{
      .initial_learning_rate = required_number(c, "initial_learning_rate", "ExponentialDecay"),
      .decay_steps = static_cast<int64_t>(std::llround(required_number(c, "decay_steps", "ExponentialDecay"))),
      .decay_rate = required_number(c, "decay_rate", "ExponentialDecay"),
      .staircase = get_or<bool>(c, "staircase", false),
      .name = get_or<std::string>(c, "name", "ExponentialDecay")});
}

double ExponentialDecay::operator()(int64_t step) const {
  double p = static_cast<double>(step) / static_cast<double>(decay_steps_);
  if (staircase_) p = std::floor(p);
  return initial_learning_rate_ * std::pow(decay_rate_, p);
}

Json ExponentialDecay::get_config() const {
  return Json{{"initial_learning_rate", initial_learning_rate_},
              {"decay_steps", decay_steps_},
              {"decay_rate", decay_rate_},
              {"staircase", staircase_},
              {"name", name_}};
}

// --- CosineDecay -------------------------------------------------------------------------

CosineDecay::CosineDecay(double initial_learning_rate, int64_t decay_steps, double alpha,
                         std::optional<double> warmup_target, int64_t warmup_steps, std::string name)
    : initial_learning_rate_(initial_learning_rate),
      decay_steps_(decay_steps),
      alpha_(alpha),
      warmup_target_(warmup_target),
      warmup_steps_(warmup_steps),
      name_(std::move(name)) {
  check_decay_steps(decay_steps, "CosineDecay");
  if (warmup_steps < 0)
    throw ValueError("CosineDecay: argument `warmup_steps` must be >= 0. Received: warmup_steps=" +
                     std::to_string(warmup_steps));
}

std::shared_ptr<CosineDecay> CosineDecay::from_config(const Json& c) {
  check_schedule_keys(c, {"initial_learning_rate", "decay_steps", "alpha", "name", "warmup_target", "warmup_steps"},
                      "CosineDecay");
  std::optional<double> warmup_target;
  if (c.contains("warmup_target") && !c["warmup_target"].is_null())
    warmup_target = get_or<double>(c, "warmup_target", 0.0);
  return std::make_shared<CosineDecay>(
      required_number(c, "initial_learning_rate", "CosineDecay"),
      static_cast<int64_t>(std::llround(required_number(c, "decay_steps", "CosineDecay"))),
      get_or<double>(c, "alpha", 0.0), warmup_target, get_or<int64_t>(c, "warmup_steps", 0),
      get_or<std::string>(c, "name", "CosineDecay"));
}

double CosineDecay::operator()(int64_t step_in) const {
  const double decay_steps = static_cast<double>(decay_steps_);
  double step = static_cast<double>(step_in);
  auto decay = [&](double s, double from_lr) {
    const double cosine = 0.5 * (1.0 + std::cos(M_PI * s / decay_steps));
    return from_lr * ((1.0 - alpha_) * cosine + alpha_);
  };
  if (!warmup_target_) return decay(std::min(step, decay_steps), initial_learning_rate_);
  const double warmup_steps = static_cast<double>(warmup_steps_);
  step = std::min(step, decay_steps + warmup_steps);
  if (step < warmup_steps)
    return (*warmup_target_ - initial_learning_rate_) * (step / warmup_steps) + initial_learning_rate_;
  return decay(step - warmup_steps, *warmup_target_);
}

Json CosineDecay::get_config() const {
  return Json{{"initial_learning_rate", initial_learning_rate_},
              {"decay_steps", decay_steps_},
              {"alpha", alpha_},
              {"name", name_},
              {"warmup_target", warmup_target_ ? Json(*warmup_target_) : Json(nullptr)},
              {"warmup_steps", warmup_steps_}};
}

// --- PiecewiseConstantDecay -------------------------------------------------------------

PiecewiseConstantDecay::PiecewiseConstantDecay(std::vector<int64_t> boundaries, std::vector<double> values,
                                               std::string name)
    : boundaries_(std::move(boundaries)), values_(std::move(values)), name_(std::move(name)) {
  if (boundaries_.size() + 1 != values_.size()) {
    std::ostringstream os;
    os << "PiecewiseConstantDecay: the length of boundaries should be 1 less than the length of values. "
          "Received: boundaries of length "
       << boundaries_.size() << " and values of length " << values_.size();
    throw ValueError(os.str());
  }
  for (size_t i = 1; i < boundaries_.size(); ++i)
    if (boundaries_[i] <= boundaries_[i - 1])
      throw ValueError("PiecewiseConstantDecay: boundaries must be strictly increasing. Received: " +
                       json_excerpt(Json(boundaries_)));
}

std::shared_ptr<PiecewiseConstantDecay> PiecewiseConstantDecay::from_config(const Json& c) {
  check_schedule_keys(c, {"boundaries", "values", "name"}, "PiecewiseConstantDecay");
  std::vector<int64_t> boundaries;
  for (const auto& b : require(c, "boundaries", "PiecewiseConstantDecay")) {
    if (!b.is_number())
      throw ValueError("PiecewiseConstantDecay: boundaries must be numbers. Received: " + json_excerpt(b));
    boundaries.push_back(static_cast<int64_t>(std::llround(b.get<double>())));
  }
  require(c, "values", "PiecewiseConstantDecay");
  return std::make_shared<PiecewiseConstantDecay>(boundaries, get_or<std::vector<double>>(c, "values", {}),
                                                  get_or<std::string>(c, "name", "PiecewiseConstant"));
}

double PiecewiseConstantDecay::operator()(int64_t step) const {
  for (size_t i = 0; i < boundaries_.size(); ++i)
    if (step <= boundaries_[i]) return values_[i];
  return values_.back();
}

Json PiecewiseConstantDecay::get_config() const {
  return Json{{"boundaries", boundaries_}, {"values", values_}, {"name", name_}};
}

// --- PolynomialDecay ----------------------------------------------------------------------

PolynomialDecay::PolynomialDecay(const PolynomialDecayOptions& o)
    : initial_learning_rate_(o.initial_learning_rate),
      decay_steps_(o.decay_steps),
      end_learning_rate_(o.end_learning_rate),
      power_(o.power),
      cycle_(o.cycle),
      name_(o.name) {
  check_decay_steps(decay_steps_, "PolynomialDecay");
}

std::shared_ptr<PolynomialDecay> PolynomialDecay::from_config(const Json& c) {
  const std::string owner = "PolynomialDecay";
  check_schedule_keys(c, {"initial_learning_rate", "decay_steps", "end_learning_rate", "power", "cycle", "name"},
                      owner);
  return std::make_shared<PolynomialDecay>(PolynomialDecayOptions{
      .initial_learning_rate = required_number(c, "initial_learning_rate", owner),
      .decay_steps = static_cast<int64_t>(std::llround(required_number(c, "decay_steps", owner))),
      .end_learning_rate = get_or<double>(c, "end_learning_rate", 0.0001),
      .power = get_or<double>(c, "power", 1.0),
      .cycle = get_or<bool>(c, "cycle", false),
      .name = get_or<std::string>(c, "name", owner)});
}

double PolynomialDecay::operator()(int64_t step_in) const {
  double step = static_cast<double>(step_in);
  double decay_steps = static_cast<double>(decay_steps_);
  if (cycle_)
    decay_steps *= step == 0 ? 1.0 : std::ceil(step / decay_steps);
  else
    step = std::min(step, decay_steps);
  return (initial_learning_rate_ - end_learning_rate_) * std::pow(1.0 - step / decay_steps, power_) +
         end_learning_rate_;
}

Json PolynomialDecay::get_config() const {
  return Json{{"initial_learning_rate", initial_learning_rate_},
              {"decay_steps", decay_steps_},
              {"end_learning_rate", end_learning_rate_},
              {"power", power_},
              {"cycle", cycle_},
              {"name", name_}};
}

// --- InverseTimeDecay ---------------------------------------------------------------------

InverseTimeDecay::InverseTimeDecay(const InverseTimeDecayOptions& o)
    : initial_learning_rate_(o.initial_learning_rate),
      decay_steps_(o.decay_steps),
      decay_rate_(o.decay_rate),
      staircase_(o.staircase),
      name_(o.name) {
  if (!(decay_steps_ > 0)) {
    std::ostringstream os;
    os << "InverseTimeDecay: argument `decay_steps` must be > 0. Received: decay_steps=" << decay_steps_;
    throw ValueError(os.str());
  }
}

std::shared_ptr<InverseTimeDecay> InverseTimeDecay::from_config(const Json& c) {
  const std::string owner = "InverseTimeDecay";
  check_schedule_keys(c, {"initial_learning_rate", "decay_steps", "decay_rate", "staircase", "name"}, owner);
  return std::make_shared<InverseTimeDecay>(
      InverseTimeDecayOptions{.initial_learning_rate = required_number(c, "initial_learning_rate", owner),
                              .decay_steps = required_number(c, "decay_steps", owner),
                              .decay_rate = required_number(c, "decay_rate", owner),
                              .staircase = get_or<bool>(c, "staircase", false),
                              .name = get_or<std::string>(c, "name", owner)});
}

double InverseTimeDecay::operator()(int64_t step) const {
  double p = static_cast<double>(step) / decay_steps_;
  if (staircase_) p = std::floor(p);
  return initial_learning_rate_ / (1.0 + decay_rate_ * p);
}

Json InverseTimeDecay::get_config() const {
  return Json{{"initial_learning_rate", initial_learning_rate_},
              {"decay_steps", decay_steps_},
              {"decay_rate", decay_rate_},
              {"staircase", staircase_},
              {"name", name_}};
}

// --- CosineDecayRestarts ------------------------------------------------------------------

CosineDecayRestarts::CosineDecayRestarts(double initial_learning_rate, int64_t first_decay_steps, double t_mul,
                                         double m_mul, double alpha, std::string name)
    : initial_learning_rate_(initial_learning_rate),
      first_decay_steps_(first_decay_steps),
      t_mul_(t_mul),
      m_mul_(m_mul),
      alpha_(alpha),
      name_(std::move(name)) {
  if (first_decay_steps <= 0)
    throw ValueError("CosineDecayRestarts: argument `first_decay_steps` must be > 0. Received: first_decay_steps=" +
                     std::to_string(first_decay_steps));
  if (!(t_mul > 0)) {
    std::ostringstream os;
    os << "CosineDecayRestarts: argument `t_mul` must be > 0 (each period lasts t_mul times the previous one). "
          "Received: t_mul="
       << t_mul;
    throw ValueError(os.str());
  }
}

std::shared_ptr<CosineDecayRestarts> CosineDecayRestarts::from_config(const Json& c) {
  const std::string owner = "CosineDecayRestarts";
  check_schedule_keys(c, {"initial_learning_rate", "first_decay_steps", "t_mul", "m_mul", "alpha", "name"}, owner);
  return std::make_shared<CosineDecayRestarts>(
      required_number(c, "initial_learning_rate", owner),
      static_cast<int64_t>(std::llround(required_number(c, "first_decay_steps", owner))),
      get_or<double>(c, "t_mul", 2.0), get_or<double>(c, "m_mul", 1.0), get_or<double>(c, "alpha", 0.0),
      get_or<std::string>(c, "name", "SGDRDecay"));
}

double CosineDecayRestarts::operator()(int64_t step) const {
  double fraction = static_cast<double>(step) / static_cast<double>(first_decay_steps_);
  double i_restart;
  if (t_mul_ == 1.0) {
    i_restart = std::floor(fraction);
    fraction -= i_restart;
  } else {
    i_restart = std::floor(std::log(1.0 - fraction * (1.0 - t_mul_)) / std::log(t_mul_));
    const double sum_r = (1.0 - std::pow(t_mul_, i_restart)) / (1.0 - t_mul_);
    fraction = (fraction - sum_r) / std::pow(t_mul_, i_restart);
  }
  const double cosine = 0.5 * std::pow(m_mul_, i_restart) * (1.0 + std::cos(M_PI * fraction));
  return initial_learning_rate_ * ((1.0 - alpha_) * cosine + alpha_);
}

Json CosineDecayRestarts::get_config() const {
  return Json{{"initial_learning_rate", initial_learning_rate_},
              {"first_decay_steps", first_decay_steps_},
              {"t_mul", t_mul_},
              {"m_mul", m_mul_},
              {"alpha", alpha_},
              {"name", name_}};
}

}  // namespace optimizers
}  // namespace kiln
