// Spec: top-level validation, "compile" and "fit" sections.
#include "kiln/spec/spec.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "kiln/core/config_keys.h"
#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/core/json_limits.h"

namespace kiln::spec {

void check_keys(const Json& j, const std::vector<std::string>& allowed, const std::string& where) {
  check_config_keys(j, allowed, where);  // the library's one check
}

int64_t int_or(const Json& j, const char* key, int64_t fallback, const std::string& section, int64_t lo, int64_t hi) {
  if (!j.is_object()) return fallback;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  const std::string name = "`" + (section.empty() ? std::string() : section + ".") + key + "`";
  return json_integer(*it, lo, hi, name, std::string(". Received: ") + key + "=" + json_excerpt(*it));
}

namespace {

// Refuses a key given twice in one object. nlohmann's parser lets the last
// one win, which would silently drop half of what a spec says. Runs on text
// parse_json has accepted, so only duplicates can fail here.
class DuplicateKeyCheck : public nlohmann::json_sax<Json> {
 public:
  explicit DuplicateKeyCheck(std::string what) : what_(std::move(what)) {}

  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool string(string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override {
    frames_.push_back({});
    return true;
  }
  bool key(string_t& k) override {
    Frame& f = frames_.back();
    if (!f.keys.insert(k).second)
      throw ValueError(what_ + " has the key `" + k + "` twice in " + where() +
                       "; a key may appear once in an object: remove one");
    f.key = k;
    return true;
  }
  bool end_object() override { return end(); }
  bool start_array(std::size_t) override {
    frames_.push_back({.array = true});
    return true;
  }
  bool end_array() override { return end(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  struct Frame {
    bool array = false;
    size_t index = 0;  // array: the element being read
    std::string key;   // object: the key being read
    std::set<std::string> keys;
  };
  bool value() {  // a value ended: an array moves on to its next element
    if (!frames_.empty() && frames_.back().array) ++frames_.back().index;
    return true;
  }
  bool end() {
    frames_.pop_back();
    return value();
  }
  // The object being read, as `fit` or `callbacks[0].config`.
  std::string where() const {
    std::string path;
    for (size_t i = 0; i + 1 < frames_.size(); ++i)
      path +=
          frames_[i].array ? "[" + std::to_string(frames_[i].index) + "]" : (path.empty() ? "" : ".") + frames_[i].key;
    return path.empty() ? "the top-level object" : "`" + path + "`";
  }

  std::string what_;
  std::vector<Frame> frames_;
};

Json parse_strict(const std::string& text, const std::string& what) {
  Json j = parse_json(text, what);
  DuplicateKeyCheck check(what);
  Json::sax_parse(text, &check);
  return j;
}

Json checked_spec(Json spec, const std::string& path) {
  check_keys(spec,
             {"model", "data", "compile", "fit", "callbacks", "output", "distribution", "dtype_policy", "device",
              "name", "description"},
             "the spec " + path);
  for (const char* key : {"model", "data"})
    if (!spec.contains(key))
      throw ValueError("the spec " + path + " has no `" + key + "` section; see docs/SPEC.md for the format");
  return spec;
}

}  // namespace

Json read_spec(const std::string& path) {
  if (is_directory(path)) throw ValueError("the spec " + path + " is a directory; pass a JSON file");
  return checked_spec(parse_strict(read_file(path), "the spec " + path), path);
}

Json parse_spec(const std::string& text, const std::string& what) {
  return checked_spec(parse_strict(text, "the spec " + what), what);
}

CompileArgs compile_args_from_spec(const Json& compile) {
  Json c = compile.is_null() ? Json::object() : compile;
  check_keys(c, {"optimizer", "loss", "loss_weights", "metrics", "steps_per_execution", "jit_compile"},
             "the `compile` section");
  if (!c.contains("optimizer")) c["optimizer"] = "adam";
  if (!c.contains("loss")) c["loss"] = "sparse_categorical_crossentropy";
  if (!c.contains("metrics")) c["metrics"] = Json::array({"accuracy"});
  if (!c["metrics"].is_array() && !c["metrics"].is_object())
    throw ValueError(
        "`compile.metrics` must be a list of names or {class_name, config} objects, or a dict by output "
        "name. Received: " +
        json_excerpt(c["metrics"]));
  return CompileArgs::from_json(c);
}

FitArgs fit_args_from_spec(const Json& fit, std::optional<uint64_t>* seed) {
  Json f = fit.is_null() ? Json::object() : fit;
  check_keys(f,
             {"epochs", "batch_size", "validation_split", "shuffle", "seed", "verbose", "initial_epoch",
              "steps_per_epoch", "validation_steps", "validation_freq", "class_weight"},
             "the `fit` section");
  FitArgs a;
  a.epochs = int_or<int>(f, "epochs", 1, "fit");
  a.batch_size = int_or<int64_t>(f, "batch_size", 32, "fit");
  a.validation_split = get_or<double>(f, "validation_split", 0.0);
  a.shuffle = get_or<bool>(f, "shuffle", true);
  a.verbose = int_or<int>(f, "verbose", -1, "fit");
  a.initial_epoch = int_or<int>(f, "initial_epoch", 0, "fit");
  a.steps_per_epoch = int_or<int64_t>(f, "steps_per_epoch", 0, "fit");
  a.validation_steps = int_or<int64_t>(f, "validation_steps", 0, "fit");
  a.validation_freq = int_or<int>(f, "validation_freq", 1, "fit");
  if (a.epochs < 1)
    throw ValueError("`fit.epochs` must be a positive integer. Received: epochs=" + std::to_string(a.epochs));
  if (a.batch_size < 1)
    throw ValueError("`fit.batch_size` must be a positive integer. Received: batch_size=" +
                     std::to_string(a.batch_size));
  if (a.validation_split < 0 || a.validation_split >= 1)
    throw ValueError("`fit.validation_split` must be in [0, 1). Received: validation_split=" +
                     std::to_string(a.validation_split));
  if (f.contains("class_weight")) {
    if (!f["class_weight"].is_object())
      throw ValueError("`fit.class_weight` must be an object {\"<class id>\": weight}. Received: " +
                       json_excerpt(f["class_weight"]));
    for (auto& [k, v] : f["class_weight"].items()) {
      int64_t cls;
      try {
        size_t used = 0;
        cls = std::stoll(k, &used);
        if (used != k.size()) throw std::invalid_argument(k);
      } catch (const std::exception&) {
        throw ValueError("`fit.class_weight` keys must be integer class ids. Received: \"" + k + "\"");
      }
      if (!v.is_number())
        throw ValueError("`fit.class_weight[\"" + k + "\"]` must be a number. Received: " + json_excerpt(v));
      a.class_weight[cls] = v.get<double>();
    }
  }
  if (f.contains("seed") && !f["seed"].is_null()) {
    if (!f["seed"].is_number_integer() || f["seed"].get<int64_t>() < 0)
      throw ValueError("`fit.seed` must be a non-negative integer. Received: seed=" + json_excerpt(f["seed"]));
    *seed = f["seed"].get<uint64_t>();
  }
  return a;
}

}  // namespace kiln::spec
