// Spec: the "data" section. Sources are read with kiln's readers
// (kiln/data/readers.h, kiln/data/datasets.h); the CLI only picks the reader
// and applies the small transformations a spec may ask for.
#include <cmath>
#include <cstdlib>
#include <limits>

#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/core/json_limits.h"
#include "kiln/core/string_tensor.h"
#include "kiln/data/datasets.h"
#include "kiln/data/readers.h"
#include "kiln/spec/spec.h"

namespace kiln::spec {
namespace {

const std::vector<std::string> kSources = {"fashion_mnist", "csv", "jsonl", "npy", "idx", "brackets", "text_topics"};
// Keys every source accepts.
const std::vector<std::string> kCommonKeys = {"source", "scale",      "flatten",    "reshape", "skip",
                                              "limit",  "test_limit", "test_split", "dtype",   "allow_non_finite"};

// `skip`: how many leading training rows to drop (before `limit`), so one
// data section can name the rows another one leaves out (an ensemble's
// validation rows after a search that used `limit`). `n` is the row count.
int64_t skip_rows(const Json& d, int64_t n) {
  if (!d.contains("skip") || d["skip"].is_null()) return 0;
  if (!d["skip"].is_number_integer() || d["skip"].get<int64_t>() < 0)
    throw ValueError("`data.skip` must be a non-negative integer. Received: " + json_excerpt(d["skip"]));
  const int64_t k = d["skip"].get<int64_t>();
  if (k >= n)
    throw ValueError("`data.skip`=" + std::to_string(k) + " leaves no training rows of " + std::to_string(n) +
                     "; skip fewer");
  return k;
}

std::vector<std::string> with_common(std::vector<std::string> own) {
  own.insert(own.end(), kCommonKeys.begin(), kCommonKeys.end());
  return own;
}

std::string str_key(const Json& d, const char* key, const std::string& source) {
  if (!d.contains(key) || !d[key].is_string() || d[key].get<std::string>().empty())
    throw ValueError("the `data` section (source \"" + source + "\") needs `" + key + "`, a file path");
  return d[key].get<std::string>();
}

std::string opt_str(const Json& d, const char* key) {
  if (!d.contains(key) || d[key].is_null()) return "";
  if (!d[key].is_string())
    throw ValueError("`data." + std::string(key) + "` must be a string. Received: " + json_excerpt(d[key]));
  return d[key].get<std::string>();
}

// A number, or a fraction written "1/255".
double parse_scale(const Json& v) {
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    char* end = nullptr;
    double a = std::strtod(s.c_str(), &end);
    if (end != s.c_str()) {
      if (*end == '\0') return a;
      if (*end == '/') {
        const char* b_start = end + 1;
        double b = std::strtod(b_start, &end);
        if (end != b_start && *end == '\0' && b != 0) return a / b;
      }
    }
  }
  throw ValueError("`data.scale` must be a number or a fraction like \"1/255\". Received: " + json_excerpt(v));
}

data::LabelType label_type(const Json& d) {
  std::string t = opt_str(d, "label_type");
  if (t.empty() || t == "int64" || t == "int") return data::LabelType::kInt64;
  if (t == "float32" || t == "float") return data::LabelType::kFloat32;
  throw ValueError("`data.label_type` must be \"int64\" (class ids) or \"float32\" (regression). Received: \"" + t +
                   "\"");
}

std::vector<std::string> str_list(const Json& d, const char* key) {
  std::vector<std::string> out;
  if (!d.contains(key) || d[key].is_null()) return out;
  if (!d[key].is_array())
    throw ValueError("`data." + std::string(key) + "` must be a list of names. Received: " + json_excerpt(d[key]));
  for (auto& x : d[key]) {
    if (!x.is_string())
      throw ValueError("`data." + std::string(key) + "` must be a list of names. Received: " + json_excerpt(d[key]));
    out.push_back(x.get<std::string>());
  }
  return out;
}

// Integer label tensors (uint8 from IDX/npy) become int64, as kiln's losses take.
at::Tensor as_labels(const at::Tensor& y) {
  if (!y.defined()) return y;
  if (at::isIntegralType(y.scalar_type(), /*includeBool=*/true)) return y.to(at::kLong);
  return y.to(at::kFloat);
}

void check_pair(const at::Tensor& x, const at::Tensor& y, const std::string& what) {
  if (x.dim() == 0) throw ValueError(what + ": the features must have at least one dimension (one row per example)");
  if (y.defined() && (y.dim() == 0 || y.size(0) != x.size(0)))
    throw ShapeError(what + ": " + std::to_string(x.size(0)) + " feature rows but " +
                     (y.dim() == 0 ? std::string("a scalar label") : std::to_string(y.size(0)) + " labels") +
                     "; the files must hold one label per example");
}

// --- named inputs and outputs (csv) --------------------------------------------------

struct NamedColumns {
  std::vector<std::string> names;
  std::vector<std::vector<std::string>> columns;  // per name
  std::vector<data::LabelType> types;             // outputs only
};

std::vector<std::string> column_list(const Json& v, const std::string& where) {
  std::vector<std::string> out;
  if (v.is_string()) return {v.get<std::string>()};
  if (v.is_array())
    for (auto& c : v) {
      if (!c.is_string()) break;
      out.push_back(c.get<std::string>());
    }
  if (out.empty() || (v.is_array() && out.size() != v.size()))
    throw ValueError(
        where + " must be a column name or a non-empty list of column names. Received: " + v.dump().substr(0, 200));
  return out;
}

// "inputs": {"features": ["a", "b"], "extra": "c"}
NamedColumns named_inputs(const Json& j) {
  if (!j.is_object() || j.empty())
    throw ValueError(
        "`data.inputs` must map each model input name to its columns, e.g. {\"features\": [\"a\", \"b\"]}");
  NamedColumns n;
  for (auto it = j.begin(); it != j.end(); ++it) {
    n.names.push_back(it.key());
    n.columns.push_back(column_list(it.value(), "`data.inputs." + it.key() + "`"));
  }
  return n;
}

// "outputs": {"digit": "digit", "sign": {"column": "sign", "type": "float32"}}
NamedColumns named_outputs(const Json& j) {
  if (!j.is_object() || j.empty())
    throw ValueError("`data.outputs` must map each model output name to its label column, e.g. {\"digit\": \"label\"}");
  NamedColumns n;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string where = "`data.outputs." + it.key() + "`";
    Json v = it.value();
    if (v.is_string()) v = Json{{"column", v}};
    check_keys(v, {"column", "type"}, where);
    if (!v.contains("column") || !v["column"].is_string())
      throw ValueError(where + " needs `column`, the label column's name");
    n.names.push_back(it.key());
    n.columns.push_back({v["column"].get<std::string>()});
    n.types.push_back(label_type(Json{{"label_type", v.value("type", Json("int64"))}}));
  }
  return n;
}

at::Tensor narrow_rows(const at::Tensor& t, int64_t start, int64_t n) { return t.narrow(0, start, n); }

DataSplits load_named_csv(const Json& d, const std::string& source) {
  if (source != "csv") throw ValueError("`data.inputs` / `data.outputs` are read from csv data; use source \"csv\"");
  for (const char* k : {"features", "label", "label_type", "flatten", "reshape"})
    if (d.contains(k))
      throw ValueError(std::string("the `data` section sets `") + k +
                       "` with `inputs`/`outputs`; name columns per input in `inputs` and per output in `outputs`");
  if (!d.contains("inputs") || !d.contains("outputs"))
    throw ValueError(
        "the `data` section needs both `inputs` (columns per model input) and `outputs` (label column per "
        "model output) when it names either");
  NamedColumns ins = named_inputs(d["inputs"]), outs = named_outputs(d["outputs"]);
  std::vector<std::string> columns;
  auto index_of = [&](const std::string& c) {
    for (size_t i = 0; i < columns.size(); ++i)
      if (columns[i] == c) return (int64_t)i;
    columns.push_back(c);
    return (int64_t)columns.size() - 1;
  };
  std::vector<std::vector<int64_t>> in_idx, out_idx;
  for (auto& cols : ins.columns) {
    in_idx.emplace_back();
    for (auto& c : cols) in_idx.back().push_back(index_of(c));
  }
  for (auto& cols : outs.columns) out_idx.push_back({index_of(cols[0])});
  data::CsvOptions o;
  o.feature_columns = columns;
  const std::string delim = opt_str(d, "delimiter");
  if (delim.size() > 1) throw ValueError("`data.delimiter` must be one character. Received: \"" + delim + "\"");
  if (!delim.empty()) o.delimiter = delim[0];
  at::ScalarType dtype = dtype_from_string(get_or<std::string>(d, "dtype", "float32"));
  const bool has_scale = d.contains("scale") && !d["scale"].is_null();
  const double scale = has_scale ? parse_scale(d["scale"]) : 1.0;
  if (has_scale && !at::isFloatingType(dtype))
    throw ValueError("`data.scale` needs a floating `data.dtype`. Received: dtype=" + dtype_to_string(dtype));
  auto read = [&](const std::string& path, Tensors* xs, Tensors* ys) {
    at::Tensor all = data::read_csv(path, o).features;  // (N, columns) float32
    for (auto& idx : in_idx) {
      at::Tensor x = all.index_select(1, at::tensor(idx, at::kLong)).to(dtype);
      xs->push_back((has_scale ? x.mul(scale) : x).contiguous());
    }
    for (size_t i = 0; i < out_idx.size(); ++i) {
      at::Tensor y = all.select(1, out_idx[i][0]).contiguous();
      if (outs.types[i] == data::LabelType::kInt64) {
        if (!at::equal(y, y.round()))
          throw ValueError(path + ": column '" + outs.columns[i][0] + "' (output '" + outs.names[i] +
                           "') holds non-integer values; give it \"type\": \"float32\" for regression labels");
        y = y.to(at::kLong);
      }
      ys->push_back(y);
    }
  };
  DataSplits s;
  s.description = "csv " + str_key(d, "path", source);
  s.input_names = ins.names;
  s.output_names = outs.names;
  read(str_key(d, "path", source), &s.xs_train, &s.ys_train);
  const std::string test_path = opt_str(d, "test_path");
  if (!test_path.empty()) read(test_path, &s.xs_test, &s.ys_test);
  double test_split = get_or<double>(d, "test_split", 0.0);
  if (test_split < 0 || test_split >= 1)
    throw ValueError("`data.test_split` must be in [0, 1). Received: test_split=" + std::to_string(test_split));
  if (test_split > 0) {
    if (!test_path.empty())
      throw ValueError("`data.test_split` is set but the source already has a test split; drop one");
    const int64_t n = s.xs_train[0].size(0), n_test = (int64_t)std::floor(n * test_split);
    if (n_test < 1 || n_test >= n)
      throw ValueError("`data.test_split`=" + std::to_string(test_split) + " leaves no examples on one side of " +
                       std::to_string(n) + " rows");
    for (auto [from, to] : {std::pair{&s.xs_train, &s.xs_test}, std::pair{&s.ys_train, &s.ys_test}})
      for (auto& t : *from) {
        to->push_back(narrow_rows(t, n - n_test, n_test));
        t = narrow_rows(t, 0, n - n_test);
      }
  }
  if (const int64_t k = skip_rows(d, s.xs_train[0].size(0)); k > 0)
    for (auto* list : {&s.xs_train, &s.ys_train})
      for (auto& t : *list) t = narrow_rows(t, k, t.size(0) - k);
  for (auto [key, is_test] : {std::pair{"limit", false}, std::pair{"test_limit", true}}) {
    int64_t n = int_or<int64_t>(d, key, 0, "data");
    if (d.contains(key) && !d[key].is_null() && n < 1)
      throw ValueError(std::string("`data.") + key + "` must be a positive integer. Received: " + d[key].dump());
    if (n > 0)
      for (auto* list :
           is_test ? std::vector<Tensors*>{&s.xs_test, &s.ys_test} : std::vector<Tensors*>{&s.xs_train, &s.ys_train})
        for (auto& t : *list)
          if (t.size(0) > n) t = narrow_rows(t, 0, n);
  }
  s.x_train = s.xs_train[0];
  s.y_train = s.ys_train[0];
  if (!s.xs_test.empty()) {
    s.x_test = s.xs_test[0];
    s.y_test = s.ys_test[0];
  }
  return s;
}

}  // namespace

void model_data(const DataSplits& data, const models::Model& model, bool test, Tensors* x, Tensors* y) {
  if (data.input_names.empty()) {
    *x = {test ? data.x_test : data.x_train};
    *y = {test ? data.y_test : data.y_train};
    return;
  }
  auto pick = [](const std::vector<std::string>& want, const std::vector<std::string>& have, const Tensors& tensors,
                 const char* what) {
    if (want.size() == 1 && have.size() == 1) return Tensors{tensors[0]};
    Tensors out;
    std::string known;
    for (auto& h : have) known += (known.empty() ? "" : ", ") + h;
    for (auto& w : want) {
      size_t i = 0;
      while (i < have.size() && have[i] != w) ++i;
      if (i == have.size())
        throw ValueError(std::string("the model's ") + what + " '" + w + "' has no data: `data." + what + "s` names " +
                         known);
      out.push_back(tensors[i]);
    }
    if (want.size() != have.size())
      throw ValueError(std::string("`data.") + what + "s` names " + std::to_string(have.size()) + " " + what + "s (" +
                       known + ") but the model has " + std::to_string(want.size()));
    return out;
  };
  *x = pick(model.input_names(), data.input_names, test ? data.xs_test : data.xs_train, "input");
  *y = pick(model.output_names(), data.output_names, test ? data.ys_test : data.ys_train, "output");
}

DataSplits load_data(const Json& d) {
  if (!d.is_object()) throw ValueError("the `data` section must be a JSON object. Received: " + json_excerpt(d));
  const std::string source = opt_str(d, "source");
  if (source.empty())
    throw ValueError(
        "the `data` section needs `source`: one of fashion_mnist, csv, jsonl, npy, idx, brackets, text_topics");
  // NaN/inf features train a model to NaN weights: refused unless asked for.
  const bool allow_non_finite = get_or<bool>(d, "allow_non_finite", false);
  DataSplits s;
  if (source == "fashion_mnist") {
    check_keys(d, with_common({"directory"}), "the `data` section (source \"fashion_mnist\")");
    auto fm = datasets::fashion_mnist(opt_str(d, "directory"));
    s = {"fashion_mnist", fm.x_train, fm.y_train, fm.x_test, fm.y_test};
  } else if (source == "csv" || source == "jsonl") {
    check_keys(d,
               with_common({"path", "test_path", "label", "label_type", "features", "delimiter", "inputs", "outputs"}),
               "the `data` section (source \"" + source + "\")");
    if (d.contains("inputs") || d.contains("outputs")) return load_named_csv(d, source);
    const std::string path = str_key(d, "path", source), test_path = opt_str(d, "test_path");
    auto read = [&](const std::string& p) {
      if (source == "csv") {
        data::CsvOptions o;
        o.label_column = opt_str(d, "label");
        o.label_type = label_type(d);
        o.feature_columns = str_list(d, "features");
        std::string delim = opt_str(d, "delimiter");
        if (delim.size() > 1) throw ValueError("`data.delimiter` must be one character. Received: \"" + delim + "\"");
        if (!delim.empty()) o.delimiter = delim[0];
        o.allow_non_finite = allow_non_finite;
        return data::read_csv(p, o);
      }
      data::JsonlOptions o;
      o.feature_keys = str_list(d, "features");
      if (o.feature_keys.empty())
        throw ValueError("the `data` section (source \"jsonl\") needs `features`: the keys holding each row's inputs");
      o.label_key = opt_str(d, "label");
      o.label_type = label_type(d);
      o.allow_non_finite = allow_non_finite;
      return data::read_jsonl(p, o);
    };
    auto train = read(path);
    s.description = source + " " + path;
    s.x_train = train.features;
    s.y_train = train.labels;
    if (!test_path.empty()) {
      auto test = read(test_path);
      s.x_test = test.features;
      s.y_test = test.labels;
    }
  } else if (source == "npy" || source == "idx") {
    check_keys(d, with_common({"x", "y", "x_test", "y_test"}), "the `data` section (source \"" + source + "\")");
    auto read = [&](const std::string& p) { return source == "npy" ? data::read_npy(p) : data::read_idx(p); };
    auto read_x = [&](const std::string& p) {
      at::Tensor x = read(p);
      if (!allow_non_finite) data::check_finite_features(x, p);
      return x;
    };
    s.description = source + " " + str_key(d, "x", source);
    s.x_train = read_x(str_key(d, "x", source));
    if (!opt_str(d, "y").empty()) s.y_train = read(opt_str(d, "y"));
    if (!opt_str(d, "x_test").empty()) {
      s.x_test = read_x(opt_str(d, "x_test"));
      if (!opt_str(d, "y_test").empty()) s.y_test = read(opt_str(d, "y_test"));
    } else if (!opt_str(d, "y_test").empty()) {
      throw ValueError("`data.y_test` is set but `data.x_test` is not; give both or neither");
    }
  } else if (source == "brackets") {
    // A generated sequence task (kiln/data/datasets.h): int64 token ids, 0-padded.
    check_keys(d, with_common({"train_size", "test_size", "min_length", "max_length", "seed"}),
               "the `data` section (source \"brackets\")");
    auto positive = [&](const char* key, int64_t fallback) {
      if (!d.contains(key)) return fallback;
      if (!d[key].is_number_integer() || d[key].get<int64_t>() < 0)
        throw ValueError(std::string("`data.") + key +
                         "` must be a non-negative integer. Received: " + d[key].dump().substr(0, 40));
      return d[key].get<int64_t>();
    };
    auto b = datasets::balanced_brackets(positive("train_size", 20000), positive("test_size", 2000),
                                         positive("min_length", 2), positive("max_length", 20),
                                         (uint64_t)positive("seed", 1234));
    s = {"balanced brackets (generated)", b.x_train, b.y_train, b.x_test, b.y_test};
  } else if (source == "text_topics") {
    // A generated text task (kiln/data/datasets.h): raw sentences as a string tensor.
    check_keys(d, with_common({"train_size", "test_size", "seed"}), "the `data` section (source \"text_topics\")");
    auto count = [&](const char* key, int64_t fallback) {
      return int_or(d, key, fallback, "data", 1, int64_t(1) << 24);
    };
    auto t = datasets::text_topics(count("train_size", 4000), count("test_size", 1000),
                                   (uint64_t)int_or(d, "seed", 1234, "data", 0, std::numeric_limits<int64_t>::max()));
    s.description = "text topics (generated)";
    s.x_train = strings::encode(t.x_train);
    s.y_train = t.y_train;
    s.x_test = strings::encode(t.x_test);
    s.y_test = t.y_test;
    s.text = true;
  } else {
    throw ValueError("unknown data source \"" + source +
                     "\"; known sources: fashion_mnist, csv, jsonl, npy, idx, brackets, text_topics");
  }
  s.y_train = as_labels(s.y_train);
  s.y_test = as_labels(s.y_test);
  check_pair(s.x_train, s.y_train, "training data");
  if (s.has_test()) check_pair(s.x_test, s.y_test, "test data");

  // Hold out the last fraction as the test split (before `limit`, so the
  // test set does not shrink with it).
  double test_split = get_or<double>(d, "test_split", 0.0);
  if (test_split < 0 || test_split >= 1)
    throw ValueError("`data.test_split` must be in [0, 1). Received: test_split=" + std::to_string(test_split));
  if (test_split > 0) {
    if (s.has_test()) throw ValueError("`data.test_split` is set but the source already has a test split; drop one");
    int64_t n = s.x_train.size(0), n_test = (int64_t)std::floor(n * test_split);
    if (n_test < 1 || n_test >= n)
      throw ValueError("`data.test_split`=" + std::to_string(test_split) + " leaves no examples on one side of " +
                       std::to_string(n) + " rows");
    s.x_test = s.x_train.narrow(0, n - n_test, n_test);
    s.y_test = s.y_train.defined() ? s.y_train.narrow(0, n - n_test, n_test) : at::Tensor();
    s.x_train = s.x_train.narrow(0, 0, n - n_test);
    if (s.y_train.defined()) s.y_train = s.y_train.narrow(0, 0, n - n_test);
  }
  if (const int64_t k = skip_rows(d, s.x_train.size(0)); k > 0) {
    s.x_train = s.x_train.narrow(0, k, s.x_train.size(0) - k);
    if (s.y_train.defined()) s.y_train = s.y_train.narrow(0, k, s.y_train.size(0) - k);
  }
  auto take = [](at::Tensor& t, int64_t n) {
    if (t.defined() && t.size(0) > n) t = t.narrow(0, 0, n);
  };
  for (auto [key, is_test] : {std::pair{"limit", false}, std::pair{"test_limit", true}}) {
    int64_t n = int_or<int64_t>(d, key, 0, "data");
    if (d.contains(key) && !d[key].is_null() && n < 1)
      throw ValueError(std::string("`data.") + key + "` must be a positive integer. Received: " + json_excerpt(d[key]));
    if (n > 0) {
      take(is_test ? s.x_test : s.x_train, n);
      take(is_test ? s.y_test : s.y_train, n);
    }
  }

  if (s.text) {  // texts stay strings: no dtype, scale or reshape
    for (const char* key : {"scale", "flatten", "reshape"})
      if (d.contains(key) && !d[key].is_null())
        throw ValueError(std::string("`data.") + key + "` does not apply to text (source \"" + source +
                         "\" gives strings); drop it");
    if (d.contains("dtype") && d["dtype"] != "string")
      throw ValueError("source \"" + source +
                       "\" gives strings: `data.dtype` may only be \"string\". Received: " + json_excerpt(d["dtype"]));
    return s;
  }
  // Features: dtype, scale, reshape/flatten.
  at::ScalarType dtype = dtype_from_string(get_or<std::string>(d, "dtype", "float32"));
  const bool has_scale = d.contains("scale") && !d["scale"].is_null();
  const double scale = has_scale ? parse_scale(d["scale"]) : 1.0;
  if (has_scale && !at::isFloatingType(dtype))
    throw ValueError("`data.scale` needs a floating `data.dtype`. Received: dtype=" + dtype_to_string(dtype));
  if (d.contains("flatten") && d.contains("reshape"))
    throw ValueError("the `data` section sets both `flatten` and `reshape`; use one");
  Shape reshape;
  if (d.contains("reshape")) {
    if (!d["reshape"].is_array())
      throw ValueError("`data.reshape` must be a list of dims without the batch dim, e.g. [28, 28, 1]");
    for (auto& v : d["reshape"]) {
      if (!v.is_number_integer() || v.get<int64_t>() < 1)
        throw ValueError("`data.reshape` must be a list of positive dims without the batch dim. Received: " +
                         json_excerpt(d["reshape"]));
      reshape.push_back(v.get<int64_t>());
    }
  }
  const bool flatten = get_or<bool>(d, "flatten", false);
  auto features = [&](at::Tensor x) {
    if (!x.defined()) return x;
    x = x.to(dtype);
    if (has_scale) x = x.mul(scale);
    if (flatten) x = x.reshape({x.size(0), -1});
    if (!reshape.empty()) {
      int64_t want = 1, have = x.numel() / std::max<int64_t>(1, x.size(0));
      for (auto v : reshape) want *= v;
      if (want != have)
        throw ShapeError("`data.reshape` " + shape_to_string(reshape) + " holds " + std::to_string(want) +
                         " values but each example has " + std::to_string(have));
      Shape full = {x.size(0)};
      full.insert(full.end(), reshape.begin(), reshape.end());
      x = x.reshape(full);
    }
    return x.contiguous();
  };
  s.x_train = features(s.x_train);
  s.x_test = features(s.x_test);
  return s;
}

}  // namespace kiln::spec
