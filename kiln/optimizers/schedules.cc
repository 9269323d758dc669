#include "kiln/optimizers/schedules.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "kiln/core/config_fields.h"
#include "kiln/core/error.h"
#include "kiln/core/json_limits.h"

namespace kiln {
namespace {

void check_decay_steps(int64_t decay_steps, const std::string& owner) {
  if (decay_steps <= 0)
    throw ValueError(owner +
                     ": argument `decay_steps` must be > 0. Received: decay_steps=" + std::to_string(decay_steps));
}

// A required number.
template <class O>
config::Field<O, double> required_number(const char* key, double O::*member) {
  return config::field(key, member).required("a number");
}

// A required step count, given as any number (Keras's are Python ints or
// floats) and rounded.
template <class O>
config::FieldDef<O> required_steps(const char* key, int64_t O::*member) {
  return config::FieldDef<O>{key,
                             [key, member](config::Reader& r, O& o) {
                               if (!r.has(key))
                                 throw ValueError(r.owner() + ": the config is missing `" + key + "` (a number)");
                               o.*member = static_cast<int64_t>(std::llround(r.number(key, 0.0)));
                             },
                             nullptr, [key, member](Json& j, const O& o) { j[key] = o.*member; }};
}

// A required list of numbers (rounded for integer T).
template <class O, class T>
config::FieldDef<O> required_list(const char* key, std::vector<T> O::*member) {
  return config::FieldDef<O>{
      key,
      [key, member](config::Reader& r, O& o) {
        const Json* j = r.get(key);
        if (!j) throw ValueError(r.owner() + ": the config is missing `" + key + "` (a list of numbers)");
        if (!j->is_array()) r.invalid(key, "a list of numbers");
        std::vector<T> v;
        for (const auto& e : *j) {
          if (!e.is_number()) r.invalid(key, "a list of numbers");
          if constexpr (std::is_integral_v<T>)
            v.push_back(static_cast<T>(std::llround(e.get<double>())));
          else
            v.push_back(e.get<T>());
        }
        o.*member = std::move(v);
      },
      nullptr, [key, member](Json& j, const O& o) { j[key] = o.*member; }};
}

// The config of a schedule: its Options struct's fields, in table order.
template <class O>
Json schedule_config(const O& o, const config::FieldTable<O>& table) {
  Json j = Json::object();
  config::write_fields(j, o, table);
  return j;
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

namespace {
const config::FieldTable<ExponentialDecayOptions>& exponential_decay_fields() {
  using O = ExponentialDecayOptions;
  static const config::FieldTable<O> t = {required_number("initial_learning_rate", &O::initial_learning_rate),
                                          required_steps("decay_steps", &O::decay_steps),
                                          required_number("decay_rate", &O::decay_rate),
                                          config::field("staircase", &O::staircase), config::field("name", &O::name)};
  return t;
}
}  // namespace

ExponentialDecay::ExponentialDecay(const ExponentialDecayOptions& o) : options_(o) {
  check_decay_steps(o.decay_steps, "ExponentialDecay");
}

std::shared_ptr<ExponentialDecay> ExponentialDecay::from_config(const Json& c) {
  return std::make_shared<ExponentialDecay>(config::read_fields(c, "ExponentialDecay", exponential_decay_fields()));
}

double ExponentialDecay::operator()(int64_t step) const {
  double p = static_cast<double>(step) / static_cast<double>(options_.decay_steps);
  if (options_.staircase) p = std::floor(p);
  return options_.initial_learning_rate * std::pow(options_.decay_rate, p);
}

Json ExponentialDecay::get_config() const { return schedule_config(options_, exponential_decay_fields()); }

// --- CosineDecay -------------------------------------------------------------------------

namespace {
const config::FieldTable<CosineDecayOptions>& cosine_decay_fields() {
  using O = CosineDecayOptions;
  static const config::FieldTable<O> t = {required_number("initial_learning_rate", &O::initial_learning_rate),
                                          required_steps("decay_steps", &O::decay_steps),
                                          config::field("alpha", &O::alpha),
                                          config::field("name", &O::name),
                                          config::field("warmup_target", &O::warmup_target),
                                          config::field("warmup_steps", &O::warmup_steps)};
  return t;
}
}  // namespace

CosineDecay::CosineDecay(double initial_learning_rate, int64_t decay_steps, double alpha,
                         std::optional<double> warmup_target, int64_t warmup_steps, std::string name)
    : CosineDecay(CosineDecayOptions{.initial_learning_rate = initial_learning_rate,
                                     .decay_steps = decay_steps,
                                     .alpha = alpha,
                                     .warmup_target = warmup_target,
                                     .warmup_steps = warmup_steps,
                                     .name = std::move(name)}) {}

CosineDecay::CosineDecay(const CosineDecayOptions& o) : options_(o) {
  check_decay_steps(o.decay_steps, "CosineDecay");
  if (o.warmup_steps < 0)
    throw ValueError("CosineDecay: argument `warmup_steps` must be >= 0. Received: warmup_steps=" +
                     std::to_string(o.warmup_steps));
}

std::shared_ptr<CosineDecay> CosineDecay::from_config(const Json& c) {
  return std::make_shared<CosineDecay>(config::read_fields(c, "CosineDecay", cosine_decay_fields()));
}

double CosineDecay::operator()(int64_t step_in) const {
  const CosineDecayOptions& o = options_;
  const double decay_steps = static_cast<double>(o.decay_steps);
  double step = static_cast<double>(step_in);
  auto decay = [&](double s, double from_lr) {
    const double cosine = 0.5 * (1.0 + std::cos(M_PI * s / decay_steps));
    return from_lr * ((1.0 - o.alpha) * cosine + o.alpha);
  };
  if (!o.warmup_target) return decay(std::min(step, decay_steps), o.initial_learning_rate);
  const double warmup_steps = static_cast<double>(o.warmup_steps);
  step = std::min(step, decay_steps + warmup_steps);
  if (step < warmup_steps)
    return (*o.warmup_target - o.initial_learning_rate) * (step / warmup_steps) + o.initial_learning_rate;
  return decay(step - warmup_steps, *o.warmup_target);
}

Json CosineDecay::get_config() const { return schedule_config(options_, cosine_decay_fields()); }

// --- PiecewiseConstantDecay -------------------------------------------------------------

namespace {
const config::FieldTable<PiecewiseConstantDecayOptions>& piecewise_constant_decay_fields() {
  using O = PiecewiseConstantDecayOptions;
  static const config::FieldTable<O> t = {required_list("boundaries", &O::boundaries),
                                          required_list("values", &O::values), config::field("name", &O::name)};
  return t;
}
}  // namespace

PiecewiseConstantDecay::PiecewiseConstantDecay(std::vector<int64_t> boundaries, std::vector<double> values,
                                               std::string name)
    : PiecewiseConstantDecay(PiecewiseConstantDecayOptions{std::move(boundaries), std::move(values), std::move(name)}) {
}

PiecewiseConstantDecay::PiecewiseConstantDecay(PiecewiseConstantDecayOptions o) : options_(std::move(o)) {
  const auto& boundaries = options_.boundaries;
  if (boundaries.size() + 1 != options_.values.size()) {
    std::ostringstream os;
    os << "PiecewiseConstantDecay: the length of boundaries should be 1 less than the length of values. "
          "Received: boundaries of length "
       << boundaries.size() << " and values of length " << options_.values.size();
    throw ValueError(os.str());
  }
  for (size_t i = 1; i < boundaries.size(); ++i)
    if (boundaries[i] <= boundaries[i - 1])
      throw ValueError("PiecewiseConstantDecay: boundaries must be strictly increasing. Received: " +
                       json_excerpt(Json(boundaries)));
}

std::shared_ptr<PiecewiseConstantDecay> PiecewiseConstantDecay::from_config(const Json& c) {
  return std::make_shared<PiecewiseConstantDecay>(
      config::read_fields(c, "PiecewiseConstantDecay", piecewise_constant_decay_fields()));
}

double PiecewiseConstantDecay::operator()(int64_t step) const {
  for (size_t i = 0; i < options_.boundaries.size(); ++i)
    if (step <= options_.boundaries[i]) return options_.values[i];
  return options_.values.back();
}

Json PiecewiseConstantDecay::get_config() const { return schedule_config(options_, piecewise_constant_decay_fields()); }

// --- PolynomialDecay ----------------------------------------------------------------------

namespace {
const config::FieldTable<PolynomialDecayOptions>& polynomial_decay_fields() {
  using O = PolynomialDecayOptions;
  static const config::FieldTable<O> t = {required_number("initial_learning_rate", &O::initial_learning_rate),
                                          required_steps("decay_steps", &O::decay_steps),
                                          config::field("end_learning_rate", &O::end_learning_rate),
                                          config::field("power", &O::power),
                                          config::field("cycle", &O::cycle),
                                          config::field("name", &O::name)};
  return t;
}
}  // namespace

PolynomialDecay::PolynomialDecay(const PolynomialDecayOptions& o) : options_(o) {
  check_decay_steps(o.decay_steps, "PolynomialDecay");
}

std::shared_ptr<PolynomialDecay> PolynomialDecay::from_config(const Json& c) {
  return std::make_shared<PolynomialDecay>(config::read_fields(c, "PolynomialDecay", polynomial_decay_fields()));
}

double PolynomialDecay::operator()(int64_t step_in) const {
  const PolynomialDecayOptions& o = options_;
  double step = static_cast<double>(step_in);
  double decay_steps = static_cast<double>(o.decay_steps);
  if (o.cycle)
    decay_steps *= step == 0 ? 1.0 : std::ceil(step / decay_steps);
  else
    step = std::min(step, decay_steps);
  return (o.initial_learning_rate - o.end_learning_rate) * std::pow(1.0 - step / decay_steps, o.power) +
         o.end_learning_rate;
}

Json PolynomialDecay::get_config() const { return schedule_config(options_, polynomial_decay_fields()); }

// --- InverseTimeDecay ---------------------------------------------------------------------

namespace {
const config::FieldTable<InverseTimeDecayOptions>& inverse_time_decay_fields() {
  using O = InverseTimeDecayOptions;
  static const config::FieldTable<O> t = {required_number("initial_learning_rate", &O::initial_learning_rate),
                                          required_number("decay_steps", &O::decay_steps),
                                          required_number("decay_rate", &O::decay_rate),
                                          config::field("staircase", &O::staircase), config::field("name", &O::name)};
  return t;
}
}  // namespace

InverseTimeDecay::InverseTimeDecay(const InverseTimeDecayOptions& o) : options_(o) {
  if (!(o.decay_steps > 0)) {
    std::ostringstream os;
    os << "InverseTimeDecay: argument `decay_steps` must be > 0. Received: decay_steps=" << o.decay_steps;
    throw ValueError(os.str());
  }
}

std::shared_ptr<InverseTimeDecay> InverseTimeDecay::from_config(const Json& c) {
  return std::make_shared<InverseTimeDecay>(config::read_fields(c, "InverseTimeDecay", inverse_time_decay_fields()));
}

double InverseTimeDecay::operator()(int64_t step) const {
  double p = static_cast<double>(step) / options_.decay_steps;
  if (options_.staircase) p = std::floor(p);
  return options_.initial_learning_rate / (1.0 + options_.decay_rate * p);
}

Json InverseTimeDecay::get_config() const { return schedule_config(options_, inverse_time_decay_fields()); }

// --- CosineDecayRestarts ------------------------------------------------------------------

namespace {
const config::FieldTable<CosineDecayRestartsOptions>& cosine_decay_restarts_fields() {
  using O = CosineDecayRestartsOptions;
  static const config::FieldTable<O> t = {required_number("initial_learning_rate", &O::initial_learning_rate),
                                          required_steps("first_decay_steps", &O::first_decay_steps),
                                          config::field("t_mul", &O::t_mul),
                                          config::field("m_mul", &O::m_mul),
                                          config::field("alpha", &O::alpha),
                                          config::field("name", &O::name)};
  return t;
}
}  // namespace

CosineDecayRestarts::CosineDecayRestarts(double initial_learning_rate, int64_t first_decay_steps, double t_mul,
                                         double m_mul, double alpha, std::string name)
    : CosineDecayRestarts(CosineDecayRestartsOptions{.initial_learning_rate = initial_learning_rate,
                                                     .first_decay_steps = first_decay_steps,
                                                     .t_mul = t_mul,
                                                     .m_mul = m_mul,
                                                     .alpha = alpha,
                                                     .name = std::move(name)}) {}

CosineDecayRestarts::CosineDecayRestarts(const CosineDecayRestartsOptions& o) : options_(o) {
  if (o.first_decay_steps <= 0)
    throw ValueError("CosineDecayRestarts: argument `first_decay_steps` must be > 0. Received: first_decay_steps=" +
                     std::to_string(o.first_decay_steps));
  if (!(o.t_mul > 0)) {
    std::ostringstream os;
    os << "CosineDecayRestarts: argument `t_mul` must be > 0 (each period lasts t_mul times the previous one). "
          "Received: t_mul="
       << o.t_mul;
    throw ValueError(os.str());
  }
}

std::shared_ptr<CosineDecayRestarts> CosineDecayRestarts::from_config(const Json& c) {
  return std::make_shared<CosineDecayRestarts>(
      config::read_fields(c, "CosineDecayRestarts", cosine_decay_restarts_fields()));
}

double CosineDecayRestarts::operator()(int64_t step) const {
  double fraction = static_cast<double>(step) / static_cast<double>(options_.first_decay_steps);
  double i_restart;
  if (options_.t_mul == 1.0) {
    i_restart = std::floor(fraction);
    fraction -= i_restart;
  } else {
    i_restart = std::floor(std::log(1.0 - fraction * (1.0 - options_.t_mul)) / std::log(options_.t_mul));
    const double sum_r = (1.0 - std::pow(options_.t_mul, i_restart)) / (1.0 - options_.t_mul);
    fraction = (fraction - sum_r) / std::pow(options_.t_mul, i_restart);
  }
  const double cosine = 0.5 * std::pow(options_.m_mul, i_restart) * (1.0 + std::cos(M_PI * fraction));
  return options_.initial_learning_rate * ((1.0 - options_.alpha) * cosine + options_.alpha);
}

Json CosineDecayRestarts::get_config() const { return schedule_config(options_, cosine_decay_restarts_fields()); }

}  // namespace optimizers
}  // namespace kiln
