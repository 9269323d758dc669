#include "kiln/tuning/hyperparameters.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "kiln/core/error.h"
#include "kiln/core/json_limits.h"

namespace kiln::tuning {

// --- values ---------------------------------------------------------------------------

std::string value_to_string(const Value& v) {
  if (auto b = std::get_if<bool>(&v)) return *b ? "True" : "False";
  if (auto i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (auto d = std::get_if<double>(&v)) {
    std::ostringstream os;
    os.precision(6);
    os << *d;
    return os.str();
  }
  return std::get<std::string>(v);
}

Json value_to_json(const Value& v) {
  return std::visit([](auto&& x) { return Json(x); }, v);
}

Value value_from_json(const Json& j) {
  if (j.is_boolean()) return j.get<bool>();
  if (j.is_number_integer()) return j.get<int64_t>();
  if (j.is_number()) return j.get<double>();
  if (j.is_string()) return j.get<std::string>();
  throw ValueError("a hyperparameter value must be a boolean, number or string. Received: " + json_excerpt(j));
}

namespace {

double as_double(const Value& v) {
  if (auto b = std::get_if<bool>(&v)) return *b ? 1.0 : 0.0;
  if (auto i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
  if (auto d = std::get_if<double>(&v)) return *d;
  throw ValueError("hyperparameter value '" + std::get<std::string>(v) + "' is not a number");
}

bool same_value(const Value& a, const Value& b) {
  if (a.index() == b.index()) return a == b;
  // 1 and 1.0 are the same number (JSON round trips may change the type).
  if (std::holds_alternative<std::string>(a) || std::holds_alternative<std::string>(b)) return false;
  return as_double(a) == as_double(b);
}

// Unit-interval warps of KerasTuner's samplings.
double to_unit(double v, double lo, double hi, Sampling s) {
  if (hi <= lo) return 0.5;
  switch (s) {
    case Sampling::kLinear:
      return (v - lo) / (hi - lo);
    case Sampling::kLog:
      return std::log(v / lo) / std::log(hi / lo);
    case Sampling::kReverseLog:
      return 1.0 - std::log((hi + lo - v) / lo) / std::log(hi / lo);
  }
  return 0.5;
}

double from_unit(double u, double lo, double hi, Sampling s) {
  u = std::clamp(u, 0.0, 1.0);
  if (hi <= lo) return lo;
  switch (s) {
    case Sampling::kLinear:
      return lo + u * (hi - lo);
    case Sampling::kLog:
      return lo * std::pow(hi / lo, u);
    case Sampling::kReverseLog:
      return hi + lo - lo * std::pow(hi / lo, 1.0 - u);
  }
  return lo;
}

// Snaps to min + k*step within [min, max].
double snap(double v, double lo, double hi, std::optional<double> step) {
  if (!step) return std::clamp(v, lo, hi);
  double k = std::round((v - lo) / *step);
  double out = lo + k * *step;
  while (out > hi + 1e-12) out -= *step;
  return std::max(out, lo);
}

}  // namespace

std::string sampling_name(Sampling s) {
  switch (s) {
    case Sampling::kLinear:
      return "linear";
    case Sampling::kLog:
      return "log";
    case Sampling::kReverseLog:
      return "reverse_log";
  }
  return "linear";
}

Sampling sampling_from_name(const std::string& name) {
  if (name == "linear") return Sampling::kLinear;
  if (name == "log") return Sampling::kLog;
  if (name == "reverse_log") return Sampling::kReverseLog;
  throw ValueError("`sampling` must be one of \"linear\", \"log\", \"reverse_log\". Received: \"" + name + "\"");
}

// --- HyperParameter ---------------------------------------------------------------------

std::string HyperParameter::kind_name() const {
  switch (kind) {
    case HpKind::kInt:
      return "Int";
    case HpKind::kFloat:
      return "Float";
    case HpKind::kBoolean:
      return "Boolean";
    case HpKind::kChoice:
      return "Choice";
    case HpKind::kFixed:
      return "Fixed";
  }
  return "Fixed";
}

Value HyperParameter::default_or_min() const {
  if (default_value) return *default_value;
  switch (kind) {
    case HpKind::kInt:
      return static_cast<int64_t>(min_value);
    case HpKind::kFloat:
      return min_value;
    case HpKind::kBoolean:
      return false;
    default:
      return values.at(0);
  }
}

Value HyperParameter::sample(std::mt19937_64& rng) const {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  switch (kind) {
    case HpKind::kInt: {
      double v = from_unit(u(rng), min_value, max_value + 1.0 - 1e-9, sampling);
      // Floor over [min, max+1) gives every integer equal mass under linear sampling.
      double s = step.value_or(1.0);
      double k = std::floor((std::floor(v) - min_value) / s);
      return static_cast<int64_t>(std::min(max_value, min_value + k * s));
    }
    case HpKind::kFloat:
      return snap(from_unit(u(rng), min_value, max_value, sampling), min_value, max_value, step);
    case HpKind::kBoolean:
      return u(rng) < 0.5;
    case HpKind::kChoice: {
      std::uniform_int_distribution<size_t> pick(0, values.size() - 1);
      return values[pick(rng)];
    }
    case HpKind::kFixed:
      return values.at(0);
  }
  return values.at(0);
}

int HyperParameter::encoded_size() const {
  if (kind == HpKind::kFixed) return 0;
  if (kind == HpKind::kChoice && !ordered) return static_cast<int>(values.size());
  return 1;
}

void HyperParameter::encode(const Value& v, double* out) const {
  switch (kind) {
    case HpKind::kInt:
    case HpKind::kFloat:
      out[0] = to_unit(as_double(v), min_value, max_value, sampling);  // decode rounds back
      return;
    case HpKind::kBoolean:
      out[0] = std::get<bool>(v) ? 1.0 : 0.0;
      return;
    case HpKind::kChoice: {
      size_t idx = 0;
      for (size_t i = 0; i < values.size(); ++i)
        if (same_value(values[i], v)) idx = i;
      if (ordered) {
        out[0] = values.size() > 1 ? static_cast<double>(idx) / (values.size() - 1) : 0.5;
      } else {
        for (size_t i = 0; i < values.size(); ++i) out[i] = i == idx ? 1.0 : 0.0;
      }
      return;
    }
    case HpKind::kFixed:
      return;
  }
}

Value HyperParameter::decode(const double* in) const {
  switch (kind) {
    case HpKind::kInt: {
      double v = from_unit(in[0], min_value, max_value, sampling);
      return static_cast<int64_t>(std::llround(snap(std::round(v), min_value, max_value, step.value_or(1.0))));
    }
    case HpKind::kFloat:
      return snap(from_unit(in[0], min_value, max_value, sampling), min_value, max_value, step);
    case HpKind::kBoolean:
      return in[0] >= 0.5;
    case HpKind::kChoice: {
      if (ordered) {
        size_t idx = static_cast<size_t>(std::llround(std::clamp(in[0], 0.0, 1.0) * (values.size() - 1)));
        return values[idx];
      }
      size_t best = 0;
      for (size_t i = 1; i < values.size(); ++i)
        if (in[i] > in[best]) best = i;
      return values[best];
    }
    case HpKind::kFixed:
      return values.at(0);
  }
  return values.at(0);
}

std::vector<Value> HyperParameter::grid() const {
  std::vector<Value> out;
  switch (kind) {
    case HpKind::kInt: {
      int64_t s = static_cast<int64_t>(step.value_or(1.0));
      for (int64_t v = (int64_t)min_value; v <= (int64_t)max_value; v += s) out.push_back(v);
      return out;
    }
    case HpKind::kFloat:
      if (!step) return out;
      for (double v = min_value; v <= max_value + 1e-12; v += *step) out.push_back(v);
      return out;
    case HpKind::kBoolean:
      return {false, true};
    default:
      return values;
  }
}

Json HyperParameter::config() const {
  Json c = Json::object();
  c["default"] = default_value ? value_to_json(*default_value) : Json(nullptr);
  Json conds = Json::array();
  for (auto& cond : conditions) {
    Json vals = Json::array();
    for (auto& v : cond.values) vals.push_back(value_to_json(v));
    conds.push_back(Json{{"class_name", "Parent"}, {"config", {{"name", cond.parent}, {"values", vals}}}});
  }
  c["conditions"] = conds;
  switch (kind) {
    case HpKind::kInt:
      c["min_value"] = (int64_t)min_value;
      c["max_value"] = (int64_t)max_value;
      c["step"] = (int64_t)step.value_or(1.0);
      c["sampling"] = sampling_name(sampling);
      break;
    case HpKind::kFloat:
      c["min_value"] = min_value;
      c["max_value"] = max_value;
      c["step"] = step ? Json(*step) : Json(nullptr);
      c["sampling"] = sampling_name(sampling);
      break;
    case HpKind::kChoice: {
      Json vals = Json::array();
      for (auto& v : values) vals.push_back(value_to_json(v));
      c["values"] = vals;
      c["ordered"] = ordered;
      break;
    }
    case HpKind::kFixed:
      c["value"] = value_to_json(values.at(0));
      break;
    case HpKind::kBoolean:
      break;
  }
  return c;
}

Json HyperParameter::to_json() const {
  Json j = config();
  j["type"] = kind_name();
  j["name"] = name;
  return j;
}

HyperParameter HyperParameter::from_json(const Json& j) {
  if (!j.is_object())
    throw ValueError("a hyperparameter must be an object {\"type\", \"name\", ...}. Received: " + json_excerpt(j));
  HyperParameter hp;
  hp.name = require(j, "name", "hyperparameter").get<std::string>();
  const std::string type = require(j, "type", "hyperparameter '" + hp.name + "'").get<std::string>();
  auto num = [&](const char* key) {
    const Json& v = require(j, key, "hyperparameter '" + hp.name + "'");
    if (!v.is_number())
      throw ValueError("hyperparameter '" + hp.name + "': `" + key +
                       "` must be a number. Received: " + json_excerpt(v));
    return v.get<double>();
  };
  if (type == "Int" || type == "Float") {
    hp.kind = type == "Int" ? HpKind::kInt : HpKind::kFloat;
    hp.min_value = num("min_value");
    hp.max_value = num("max_value");
    if (j.contains("step") && !j["step"].is_null()) hp.step = j["step"].get<double>();
    if (j.contains("sampling") && !j["sampling"].is_null())
      hp.sampling = sampling_from_name(j["sampling"].get<std::string>());
  } else if (type == "Boolean") {
    hp.kind = HpKind::kBoolean;
  } else if (type == "Choice") {
    hp.kind = HpKind::kChoice;
    const Json& vals = require(j, "values", "hyperparameter '" + hp.name + "'");
    if (!vals.is_array() || vals.empty())
      throw ValueError("hyperparameter '" + hp.name +
                       "': `values` must be a non-empty list. Received: " + json_excerpt(vals));
    for (auto& v : vals) hp.values.push_back(value_from_json(v));
    hp.ordered = j.value("ordered", false);
  } else if (type == "Fixed") {
    hp.kind = HpKind::kFixed;
    hp.values = {value_from_json(require(j, "value", "hyperparameter '" + hp.name + "'"))};
  } else {
    throw ValueError("hyperparameter '" + hp.name + "': unknown type \"" + type +
                     "\"; expected Int, Float, Boolean, Choice or Fixed");
  }
  if (j.contains("default") && !j["default"].is_null()) hp.default_value = value_from_json(j["default"]);
  if (j.contains("conditions"))
    for (auto& c : j["conditions"]) {
      const Json& cfg = c.contains("config") ? c["config"] : c;
      Condition cond;
      cond.parent = require(cfg, "name", "condition").get<std::string>();
      for (auto& v : require(cfg, "values", "condition")) cond.values.push_back(value_from_json(v));
      hp.conditions.push_back(cond);
    }
  return hp;
}

// --- HyperParameters ----------------------------------------------------------------------

HyperParameters::Scope::~Scope() {
  if (hp_) hp_->scope_stack_.pop_back();
}

HyperParameters::Scope HyperParameters::conditional_scope(const std::string& parent, const std::vector<Value>& values) {
  if (!find(parent))
    throw ValueError("conditional_scope: parent hyperparameter '" + parent +
                     "' is not declared yet; declare it before the scope");
  scope_stack_.push_back(Condition{parent, values});
  return Scope(this);
}

bool HyperParameters::conditions_hold(const std::vector<Condition>& conditions) const {
  for (auto& c : conditions) {
    const HyperParameter* parent = find(c.parent);
    if (!parent || !is_active(*parent)) return false;
    auto it = values_.find(c.parent);
    Value pv = it != values_.end() ? it->second : parent->default_or_min();
    bool any = false;
    for (auto& v : c.values) any = any || same_value(v, pv);
    if (!any) return false;
  }
  return true;
}

bool HyperParameters::is_active(const HyperParameter& hp) const { return conditions_hold(hp.conditions); }

const HyperParameter* HyperParameters::find(const std::string& name) const {
  for (auto& hp : space_)
    if (hp.name == name) return &hp;
  return nullptr;
}

Value HyperParameters::declare(HyperParameter hp) {
  if (hp.name.empty()) throw ValueError("a hyperparameter needs a non-empty name");
  if (const HyperParameter* existing = find(hp.name)) {
    if (existing->kind != hp.kind)
      throw ValueError("hyperparameter '" + hp.name + "' was declared as " + existing->kind_name() +
                       " and is now declared as " + hp.kind_name() + "; use another name");
  } else {
    if (hp.kind == HpKind::kInt || hp.kind == HpKind::kFloat) {
      if (hp.min_value > hp.max_value)
        throw ValueError(hp.kind_name() + " '" + hp.name + "': min_value must be <= max_value. Received: min_value=" +
                         value_to_string(hp.min_value) + ", max_value=" + value_to_string(hp.max_value));
      if (hp.sampling != Sampling::kLinear && hp.min_value <= 0)
        throw ValueError(hp.kind_name() + " '" + hp.name + "': " + sampling_name(hp.sampling) +
                         " sampling needs min_value > 0. Received: min_value=" + value_to_string(hp.min_value));
      if (hp.step && *hp.step <= 0)
        throw ValueError(hp.kind_name() + " '" + hp.name +
                         "': step must be positive. Received: step=" + value_to_string(*hp.step));
    }
    if (hp.kind == HpKind::kChoice && hp.values.empty())
      throw ValueError("Choice '" + hp.name + "' needs at least one value");
    hp.conditions.insert(hp.conditions.begin(), scope_stack_.begin(), scope_stack_.end());
    space_.push_back(hp);
  }
  const HyperParameter& h = *find(hp.name);
  auto it = values_.find(hp.name);
  return it != values_.end() ? it->second : h.default_or_min();
}

int64_t HyperParameters::Int(const std::string& name, int64_t min_value, int64_t max_value, const IntOptions& o) {
  HyperParameter hp;
  hp.kind = HpKind::kInt;
  hp.name = name;
  hp.min_value = (double)min_value;
  hp.max_value = (double)max_value;
  if (o.step) hp.step = (double)*o.step;
  hp.sampling = o.sampling;
  if (o.default_value) hp.default_value = *o.default_value;
  Value v = declare(hp);
  return (int64_t)std::llround(as_double(v));
}

double HyperParameters::Float(const std::string& name, double min_value, double max_value, const FloatOptions& o) {
  HyperParameter hp;
  hp.kind = HpKind::kFloat;
  hp.name = name;
  hp.min_value = min_value;
  hp.max_value = max_value;
  hp.step = o.step;
  hp.sampling = o.sampling;
  if (o.default_value) hp.default_value = *o.default_value;
  return as_double(declare(hp));
}

bool HyperParameters::Boolean(const std::string& name, std::optional<bool> default_value) {
  HyperParameter hp;
  hp.kind = HpKind::kBoolean;
  hp.name = name;
  if (default_value) hp.default_value = *default_value;
  Value v = declare(hp);
  return std::holds_alternative<bool>(v) ? std::get<bool>(v) : as_double(v) != 0;
}

namespace {
template <class T>
HyperParameter choice_hp(const std::string& name, const std::vector<T>& values, const ChoiceOptions& o) {
  HyperParameter hp;
  hp.kind = HpKind::kChoice;
  hp.name = name;
  for (auto& v : values) hp.values.push_back(Value(v));
  hp.ordered = o.ordered;
  hp.default_value = o.default_value;
  return hp;
}
}  // namespace

std::string HyperParameters::Choice(const std::string& name, const std::vector<std::string>& values,
                                    const ChoiceOptions& o) {
  return value_to_string(declare(choice_hp(name, values, o)));
}
int64_t HyperParameters::Choice(const std::string& name, const std::vector<int64_t>& values, const ChoiceOptions& o) {
  return (int64_t)std::llround(as_double(declare(choice_hp(name, values, o))));
}
double HyperParameters::Choice(const std::string& name, const std::vector<double>& values, const ChoiceOptions& o) {
  return as_double(declare(choice_hp(name, values, o)));
}
std::string HyperParameters::Choice(const std::string& name, std::initializer_list<const char*> values,
                                    const ChoiceOptions& o) {
  return Choice(name, std::vector<std::string>(values.begin(), values.end()), o);
}
int64_t HyperParameters::Choice(const std::string& name, std::initializer_list<int> values, const ChoiceOptions& o) {
  return Choice(name, std::vector<int64_t>(values.begin(), values.end()), o);
}
double HyperParameters::Choice(const std::string& name, std::initializer_list<double> values, const ChoiceOptions& o) {
  return Choice(name, std::vector<double>(values), o);
}

Value HyperParameters::Fixed(const std::string& name, const Value& value) {
  HyperParameter hp;
  hp.kind = HpKind::kFixed;
  hp.name = name;
  hp.values = {value};
  return declare(hp);
}

bool HyperParameters::contains(const std::string& name) const {
  const HyperParameter* hp = find(name);
  if (hp) return is_active(*hp);
  return values_.count(name) > 0;  // values set for names the space does not know (tuner/...)
}

Value HyperParameters::get(const std::string& name) const {
  const HyperParameter* hp = find(name);
  if (hp && !is_active(*hp))
    throw NotFoundError("hyperparameter '" + name + "' is inactive for these values (its condition does not hold)");
  auto it = values_.find(name);
  if (it != values_.end()) return it->second;
  if (hp) return hp->default_or_min();
  throw NotFoundError("no hyperparameter named '" + name + "'");
}

int64_t HyperParameters::get_int(const std::string& name) const { return (int64_t)std::llround(as_double(get(name))); }
double HyperParameters::get_float(const std::string& name) const { return as_double(get(name)); }
bool HyperParameters::get_bool(const std::string& name) const {
  Value v = get(name);
  return std::holds_alternative<bool>(v) ? std::get<bool>(v) : as_double(v) != 0;
}
std::string HyperParameters::get_string(const std::string& name) const { return value_to_string(get(name)); }

std::vector<std::pair<std::string, Value>> HyperParameters::values() const {
  std::vector<std::pair<std::string, Value>> out;
  for (auto& hp : space_)
    if (is_active(hp)) out.emplace_back(hp.name, get(hp.name));
  for (auto& [k, v] : values_)
    if (!find(k)) out.emplace_back(k, v);
  return out;
}

void HyperParameters::set(const std::string& name, const Value& v) { values_[name] = v; }

void HyperParameters::merge_space(const HyperParameters& other) {
  for (auto& hp : other.space_)
    if (!find(hp.name)) space_.push_back(hp);
}

HyperParameters HyperParameters::copy_space() const {
  HyperParameters out;
  out.space_ = space_;
  return out;
}

int HyperParameters::encoded_size() const {
  int n = 0;
  for (auto& hp : space_) n += hp.encoded_size();
  return n;
}

std::vector<double> HyperParameters::encode() const {
  std::vector<double> x(encoded_size(), 0.5);
  int off = 0;
  for (auto& hp : space_) {
    if (is_active(hp)) hp.encode(get(hp.name), x.data() + off);
    off += hp.encoded_size();
  }
  return x;
}

void HyperParameters::decode(const std::vector<double>& x) {
  int off = 0;
  for (auto& hp : space_) {
    values_[hp.name] = hp.decode(x.data() + off);
    off += hp.encoded_size();
  }
  // Inactive values are not part of the point.
  for (auto& hp : space_)
    if (!is_active(hp)) values_.erase(hp.name);
}

std::string HyperParameters::fingerprint() const {
  std::string key;
  for (auto& hp : space_) {
    if (!is_active(hp)) continue;
    Value v = get(hp.name);
    key += hp.name + "=" + value_to_json(v).dump() + ";";
  }
  return key;
}

Json HyperParameters::to_json() const {
  Json space = Json::array();
  for (auto& hp : space_) space.push_back(hp.to_json());
  Json vals = Json::object();
  for (auto& [k, v] : values()) vals[k] = value_to_json(v);
  return Json{{"space", space}, {"values", vals}};
}

HyperParameters HyperParameters::from_json(const Json& j) {
  HyperParameters out;
  const Json* space = &j;
  if (j.is_object()) space = &require(j, "space", "hyperparameters");
  if (!space->is_array())
    throw ValueError(
        "a search space must be a list of hyperparameters [{\"type\": \"Int\", \"name\": ...}]. Received: " +
        space->dump());
  for (auto& h : *space) {
    HyperParameter hp = HyperParameter::from_json(h);
    if (out.find(hp.name)) throw ValueError("the search space declares '" + hp.name + "' twice");
    out.space_.push_back(hp);
  }
  if (j.is_object() && j.contains("values"))
    for (auto& [k, v] : j["values"].items()) out.values_[k] = value_from_json(v);
  return out;
}

}  // namespace kiln::tuning
