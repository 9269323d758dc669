// kiln predict MODEL_DIR [--input FILE.jsonl|-] [--output FILE|-] [--batch_size N]
//
// JSON Lines in, JSON Lines out, in order. Each input line is one instance:
//   [0.1, 0.2, ...]                       a nested list (one-input models)
//   {"inputs": [0.1, ...]}                the same, TF Serving-style
//   {"inputs": {"a": [...], "b": [...]}}  named inputs
//   {"a": [...], "b": [...]}              named inputs, per the signature
// Each output line is {"predictions": [...]} (one-output models) or
// {"predictions": {"<output name>": [...], ...}}. Blank lines are skipped.
// Float32 values are written in their shortest form that reads back to the
// same float; NaN and infinities (not JSON) are written as null.
//
// Instances are checked against the model's signature (names, rank, dims)
// before anything runs, so a wrong width is a one-line error naming the line.
// Lines are batched (--batch_size) and each batch is written and flushed as
// soon as it is predicted, so the command works in a pipe.
#include <charconv>
#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>

#include "kiln/core/error.h"
#include "kiln/models/model.h"
#include "kiln/saving/model_io.h"
#include "tools/kiln/cli.h"

namespace kiln::cli {
namespace {

struct PredictOptions {
  std::string model_dir;
  std::string input = "-";
  std::string output = "-";
  int64_t batch_size = 32;
};

struct InputSpec {
  std::string name;
  at::ScalarType dtype;
  Shape shape;  // without the batch dimension; kNone where any size goes
};

// One input of one instance: values in row-major order and their shape.
struct Value {
  std::vector<double> data;
  Shape shape;
};

// Shape of a nested list from its first elements, then a walk checking that
// every sub-list agrees (no ragged lists) and leaves are numbers.
void flatten_into(const Json& v, const Shape& shape, size_t depth, std::vector<double>& out, const std::string& where) {
  if (depth < shape.size()) {
    if (!v.is_array() || (int64_t)v.size() != shape[depth])
      throw ValueError(where + " is a ragged list: every sub-list at depth " + std::to_string(depth) + " must have " +
                       std::to_string(shape[depth]) + " entries");
    for (auto& e : v) flatten_into(e, shape, depth + 1, out, where);
    return;
  }
  if (v.is_number()) out.push_back(v.get<double>());
  else if (v.is_boolean()) out.push_back(v.get<bool>() ? 1.0 : 0.0);
  else throw ValueError(where + " holds " + v.dump() + " where a number belongs");
}

Value to_value(const Json& v, const std::string& where) {
  Value out;
  const Json* cur = &v;
  while (cur->is_array()) {
    out.shape.push_back((int64_t)cur->size());
    if (cur->empty()) break;
    cur = &(*cur)[0];
  }
  flatten_into(v, out.shape, 0, out.data, where);
  return out;
}

bool fits(const Shape& got, const Shape& want) {
  if (got.size() != want.size()) return false;
  for (size_t i = 0; i < got.size(); ++i)
    if (want[i] != kNone && want[i] != got[i]) return false;
  return true;
}

std::string names_of(const std::vector<InputSpec>& inputs) {
  std::string s;
  for (auto& i : inputs) s += (s.empty() ? "" : ", ") + std::string("'") + i.name + "'";
  return s;
}

// The inputs of one line, in signature order.
std::vector<Value> parse_instance(const std::string& line, const std::vector<InputSpec>& inputs, const std::string& where) {
  Json j = parse_json(line, where);
  if (j.is_object() && j.contains("inputs")) {
    if (j.size() != 1) throw ValueError(where + ": an object with \"inputs\" must have no other keys");
    j = Json(j["inputs"]);
  }
  std::vector<Json> raw(inputs.size());
  if (j.is_object()) {
    for (auto& [k, v] : j.items()) {
      size_t i = 0;
      while (i < inputs.size() && inputs[i].name != k) ++i;
      if (i == inputs.size())
        throw ValueError(where + ": unknown input '" + k + "'; the model's inputs are " + names_of(inputs));
      raw[i] = v;
    }
    for (size_t i = 0; i < inputs.size(); ++i)
      if (raw[i].is_null()) throw ValueError(where + ": input '" + inputs[i].name + "' is missing; the model's inputs are " + names_of(inputs));
  } else if (j.is_array() || j.is_number()) {
    if (inputs.size() != 1)
      throw ValueError(where + ": the model takes " + std::to_string(inputs.size()) + " inputs (" + names_of(inputs) +
                       "); send an object {\"<name>\": [...], ...}");
    raw[0] = j;
  } else {
    throw ValueError(where + ": an instance must be a list of numbers or an object of named inputs. Received: " +
                     j.dump().substr(0, 80));
  }
  std::vector<Value> out;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Value v = to_value(raw[i], where + ", input '" + inputs[i].name + "'");
    if (!fits(v.shape, inputs[i].shape)) {
      int64_t n = num_elements(inputs[i].shape);
      throw ShapeError(where + ": input '" + inputs[i].name + "' has shape " + shape_to_string(v.shape) +
                       " but the model expects " + shape_to_string(inputs[i].shape) +
                       (n > 0 ? " (" + std::to_string(n) + " values per instance)" : std::string()));
    }
    out.push_back(std::move(v));
  }
  return out;
}

// --- output ------------------------------------------------------------------
void write_number(std::string& out, double v, bool is_float32) {
  if (!std::isfinite(v)) {
    out += "null";
    return;
  }
  char buf[64];
  auto res = is_float32 ? std::to_chars(buf, buf + sizeof buf, (float)v) : std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, res.ptr);
}

void write_nested(std::string& out, const at::Tensor& t) {  // t: contiguous, double or int64 view
  if (t.dim() == 0) {
    if (t.scalar_type() == at::kLong) out += std::to_string(t.item<int64_t>());
    else write_number(out, t.item<double>(), false);
    return;
  }
  out += '[';
  for (int64_t i = 0; i < t.size(0); ++i) {
    if (i) out += ',';
    write_nested(out, t[i]);
  }
  out += ']';
}

// Fast path for the common case (float32 rows of rank <= 2) and the general one.
void write_row(std::string& out, const at::Tensor& row) {
  if (row.scalar_type() == at::kFloat && row.dim() <= 2) {
    auto r = row.contiguous();
    const float* p = r.data_ptr<float>();
    if (r.dim() == 0) return write_number(out, p[0], true);
    int64_t rows = r.dim() == 2 ? r.size(0) : 1, cols = r.size(-1);
    if (r.dim() == 2) out += '[';
    for (int64_t i = 0; i < rows; ++i) {
      if (i) out += ',';
      out += '[';
      for (int64_t k = 0; k < cols; ++k) {
        if (k) out += ',';
        write_number(out, p[i * cols + k], true);
      }
      out += ']';
    }
    if (r.dim() == 2) out += ']';
    return;
  }
  bool integral = at::isIntegralType(row.scalar_type(), /*includeBool=*/true);
  write_nested(out, row.to(integral ? at::kLong : at::kDouble).contiguous());
}

class Predictor {
 public:
  Predictor(ModelPtr model, std::ostream& out, int64_t batch_size) : model_(std::move(model)), out_(out), batch_size_(batch_size) {
    auto shapes = model_->input_shapes();
    auto dtypes = model_->input_dtypes();
    Json sig = model_signatures(*model_)["serving_default"];
    size_t i = 0;
    for (auto& [name, info] : sig["inputs"].items()) {
      InputSpec s{name, i < dtypes.size() ? dtypes[i] : at::kFloat, Shape(shapes[i].begin() + 1, shapes[i].end())};
      inputs_.push_back(s);
      ++i;
    }
    for (auto& [name, info] : sig["outputs"].items()) output_names_.push_back(name);
  }

  const std::vector<InputSpec>& inputs() const { return inputs_; }

  void add(std::vector<Value> instance) {
    // Instances of different shapes (inputs with None dims) cannot share a batch.
    if (!pending_.empty()) {
      for (size_t i = 0; i < instance.size(); ++i)
        if (instance[i].shape != pending_[0][i].shape) {
          flush();
          break;
        }
    }
    pending_.push_back(std::move(instance));
    if ((int64_t)pending_.size() >= batch_size_) flush();
  }

  void flush() {
    if (pending_.empty()) return;
    const int64_t n = (int64_t)pending_.size();
    Tensors x;
    for (size_t i = 0; i < inputs_.size(); ++i) {
      Shape shape = {n};
      shape.insert(shape.end(), pending_[0][i].shape.begin(), pending_[0][i].shape.end());
      auto t = at::empty(shape, at::kDouble);
      double* p = t.data_ptr<double>();
      for (auto& inst : pending_) p = std::copy(inst[i].data.begin(), inst[i].data.end(), p);
      x.push_back(t.to(inputs_[i].dtype));
    }
    Tensors y = model_->predict(x, batch_size_);
    std::string buf;
    for (int64_t r = 0; r < n; ++r) {
      buf += "{\"predictions\":";
      if (y.size() == 1) {
        write_row(buf, y[0][r]);
      } else {
        buf += '{';
        for (size_t k = 0; k < y.size(); ++k) {
          if (k) buf += ',';
          buf += Json(k < output_names_.size() ? output_names_[k] : "output_" + std::to_string(k)).dump() + ":";
          write_row(buf, y[k][r]);
        }
        buf += '}';
      }
      buf += "}\n";
    }
    out_ << buf;
    out_.flush();
    pending_.clear();
  }

 private:
  ModelPtr model_;
  std::ostream& out_;
  int64_t batch_size_;
  std::vector<InputSpec> inputs_;
  std::vector<std::string> output_names_;
  std::vector<std::vector<Value>> pending_;
};

void run_predict(const PredictOptions& o) {
  ModelPtr model = load_model(o.model_dir);
  std::ifstream in_file;
  std::istream* in = &std::cin;
  if (o.input != "-") {
    in_file.open(o.input);
    if (!in_file) throw NotFoundError("cannot read --input " + o.input + ": no such file");
    in = &in_file;
  }
  std::ofstream out_file;
  std::ostream* out = &std::cout;
  if (o.output != "-") {
    out_file.open(o.output, std::ios::out | std::ios::trunc);
    if (!out_file) throw NotFoundError("cannot write --output " + o.output + ": check that its directory exists");
    out = &out_file;
  }
  Predictor predictor(model, *out, o.batch_size);
  const std::string source = o.input == "-" ? "stdin" : o.input;
  std::string line;
  for (int64_t line_no = 1; std::getline(*in, line); ++line_no) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    predictor.add(parse_instance(line, predictor.inputs(), source + " line " + std::to_string(line_no)));
  }
  predictor.flush();
  if (out_file.is_open()) {
    out_file.close();
    if (!out_file) throw IOError("writing --output " + o.output + " failed");
  }
}

}  // namespace

Command add_predict_command(CLI::App& app) {
  auto o = std::make_shared<PredictOptions>();
  CLI::App* sub = app.add_subcommand("predict", "Run a saved model on JSON Lines instances");
  sub->add_option("model_dir", o->model_dir, "A model version directory, e.g. models/fashion_mnist/1")->required();
  sub->add_option("--input", o->input, "JSON Lines file of instances, or - for stdin (default)");
  sub->add_option("--output", o->output, "Where to write the predictions (JSON Lines), or - for stdout (default)");
  sub->add_option("--batch_size", o->batch_size, "Instances per batch")->check(positive_integer());
  return {sub, [o] { run_predict(*o); }};
}

}  // namespace kiln::cli
