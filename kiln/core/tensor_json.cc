#include "kiln/core/tensor_json.h"

#include <charconv>
#include <cmath>
#include <functional>
#include <limits>
#include <type_traits>

#include "kiln/core/base64.h"
#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/core/json_limits.h"
#include "kiln/core/string_tensor.h"

namespace kiln {
namespace {

std::string path_string(const std::vector<int64_t>& path) {
  std::string s;
  for (int64_t i : path) s += "[" + std::to_string(i) + "]";
  return s;
}

double number_of(const Json& v, const std::string& what, const std::vector<int64_t>& path, const JsonNumberOptions& o) {
  if (v.is_number()) return v.get<double>();
  if (v.is_boolean()) return v.get<bool>() ? 1.0 : 0.0;
  if (o.special_float_strings && v.is_string()) {
    const auto& s = v.get_ref<const std::string&>();
    if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
    if (s == "Infinity") return std::numeric_limits<double>::infinity();
    if (s == "-Infinity") return -std::numeric_limits<double>::infinity();
  }
  const std::string at = path.empty() ? "" : " at " + path_string(path);
  throw ValueError(what + " holds " + json_excerpt(v) + at + " where a number belongs");
}

// The shape of nested lists, read off the first element at each depth.
Shape nested_shape(const Json& value, const std::string& what) {
  Shape shape;
  const Json* cur = &value;
  while (cur->is_array()) {
    if ((int)shape.size() >= kMaxJsonDepth)
      throw ValueError(what + " nests lists more than " + std::to_string(kMaxJsonDepth) + " levels deep");
    shape.push_back((int64_t)cur->size());
    if (cur->empty()) break;
    cur = &(*cur)[0];
  }
  return shape;
}

// The leaves of nested lists of `shape` in row-major order: leaf(v, path)
// makes each. Recursion depth is shape.size(), which nested_shape bounds.
template <class T, class Leaf>
void flatten(const Json& v, const Shape& shape, std::vector<int64_t>& path, std::vector<T>& out,
             const std::string& what, const Leaf& leaf) {
  const size_t depth = path.size();
  if (depth < shape.size()) {
    if (!v.is_array() || (int64_t)v.size() != shape[depth])
      throw ValueError(what + " is a ragged list: every list at depth " + std::to_string(depth) + " must have " +
                       std::to_string(shape[depth]) + " entries; " + (depth ? path_string(path) : "the value") +
                       (v.is_array() ? " has " + std::to_string(v.size()) : " is not a list"));
    for (size_t i = 0; i < v.size(); ++i) {
      path.push_back((int64_t)i);
      flatten(v[i], shape, path, out, what, leaf);
      path.pop_back();
    }
    return;
  }
  out.push_back(leaf(v, path));
}

template <class T>
void append_lists(std::string& out, const T* p, at::IntArrayRef shape, size_t depth, int64_t& i, JsonWriteOptions o) {
  if (depth == shape.size()) {
    if constexpr (std::is_same_v<T, bool>)
      out += p[i++] ? "true" : "false";
    else if constexpr (std::is_floating_point_v<T>)
      append_json_number(out, p[i++], o);
    else
      append_json_number(out, p[i++]);
    return;
  }
  out += '[';
  for (int64_t k = 0; k < shape[depth]; ++k) {
    if (k) out += ',';
    append_lists(out, p, shape, depth + 1, i, o);
  }
  out += ']';
}

// A float32 value as the double its shortest text reads as (0.1f -> 0.1), so
// that nlohmann's dump() writes the same text as append_json_number(float).
double as_short_double(float v) {
  if (!std::isfinite(v)) return v;
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  double d = 0;
  std::from_chars(buf, r.ptr, d);
  return d;
}

template <class T>
Json dom_lists(const T* p, at::IntArrayRef shape, size_t depth, int64_t& i) {
  if (depth == shape.size()) {
    const T v = p[i++];
    if constexpr (std::is_same_v<T, bool>)
      return Json(v);
    else if constexpr (std::is_same_v<T, float>)
      return Json(as_short_double(v));
    else
      return Json(v);
  }
  Json a = Json::array();
  for (int64_t k = 0; k < shape[depth]; ++k) a.push_back(dom_lists(p, shape, depth + 1, i));
  return a;
}

// Calls f(pointer) with `t` as a contiguous CPU tensor of bool, float,
// double or int64 (float16/bfloat16 widened to float, other integers to int64).
template <class F>
void with_elements(const at::Tensor& t0, F&& f) {
  at::Tensor t = t0.cpu();
  switch (t.scalar_type()) {
    case at::kBool:
      t = t.contiguous();
      return f(t.data_ptr<bool>(), t.sizes());
    case at::kFloat:
      t = t.contiguous();
      return f(t.data_ptr<float>(), t.sizes());
    case at::kHalf:
    case at::kBFloat16:
      t = t.to(at::kFloat).contiguous();
      return f(t.data_ptr<float>(), t.sizes());
    case at::kDouble:
      t = t.contiguous();
      return f(t.data_ptr<double>(), t.sizes());
    default:
      if (!at::isIntegralType(t.scalar_type(), /*includeBool=*/false))
        throw ValueError("cannot write a tensor of dtype " + dtype_to_string(t.scalar_type()) + " as JSON");
      t = t.to(at::kLong).contiguous();
      return f(t.data_ptr<int64_t>(), t.sizes());
  }
}

}  // namespace

bool is_whole_number(double d) { return std::isfinite(d) && d == std::floor(d); }

NestedNumbers json_to_numbers(const Json& value, const std::string& what, JsonNumberOptions options) {
  NestedNumbers out;
  out.shape = nested_shape(value, what);
  std::vector<int64_t> path;
  flatten(value, out.shape, path, out.values, what,
          [&](const Json& v, const std::vector<int64_t>& at) { return number_of(v, what, at, options); });
  return out;
}

bool is_b64_object(const Json& v) { return v.is_object() && v.size() == 1 && v.contains("b64"); }

NestedStrings json_to_strings(const Json& value, const std::string& what, bool b64) {
  NestedStrings out;
  out.shape = nested_shape(value, what);
  std::vector<int64_t> path;
  flatten(value, out.shape, path, out.values, what, [&](const Json& v, const std::vector<int64_t>& at) {
    const std::string where = at.empty() ? "" : " at " + path_string(at);
    if (v.is_string()) return v.get<std::string>();
    if (b64 && is_b64_object(v)) {
      if (!v["b64"].is_string()) throw ValueError(what + where + ": \"b64\" must be a string");
      try {
        return base64_decode(v["b64"].get<std::string>());
      } catch (const ValueError& e) {
        throw ValueError(what + where + ": " + e.what());
      }
    }
    throw ValueError(what + " expects dtype string. Received: " + json_excerpt(v) + where);
  });
  return out;
}

void refuse_strings(const Json& value, at::ScalarType dtype, const std::string& what, JsonNumberOptions options) {
  const Json* first = &value;
  while (first->is_array() && !first->empty()) first = &(*first)[0];
  if (!first->is_string()) return;
  const auto& s = first->get_ref<const std::string&>();
  if (options.special_float_strings && (s == "NaN" || s == "Infinity" || s == "-Infinity")) return;
  throw ValueError(what + " expects dtype " + dtype_to_string(dtype) + ". Received: " + dtype_to_string(kStringDType) +
                   " (" + json_excerpt(*first) + ")");
}

at::Tensor json_to_string_tensor(const Json& value, const std::string& what, bool b64) {
  NestedStrings n = json_to_strings(value, what, b64);
  return strings::encode(n.values, n.shape);
}

Json string_tensor_to_json(const at::Tensor& t) {
  const std::vector<std::string> values = strings::decode(t.cpu());
  const Shape shape = strings::logical_shape(t);
  size_t i = 0;
  // Recursion depth is the tensor's rank.
  std::function<Json(size_t)> lists = [&](size_t depth) -> Json {
    if (depth == shape.size()) return Json(values[i++]);
    Json a = Json::array();
    for (int64_t k = 0; k < shape[depth]; ++k) a.push_back(lists(depth + 1));
    return a;
  };
  return lists(0);
}

at::Tensor numbers_to_tensor(const std::vector<double>& values, const std::vector<int64_t>& shape,
                             at::ScalarType dtype) {
  if (dtype == at::kFloat) {
    at::Tensor t = at::empty(shape, at::TensorOptions().dtype(at::kFloat));
    float* p = t.data_ptr<float>();
    for (size_t i = 0; i < values.size(); ++i) p[i] = (float)values[i];
    return t;
  }
  auto view = at::from_blob(const_cast<double*>(values.data()), {(int64_t)values.size()}, at::kDouble);
  return view.to(dtype, /*non_blocking=*/false, /*copy=*/true).reshape(shape);
}

at::Tensor checked_numbers_to_tensor(const std::vector<double>& values, const std::vector<int64_t>& shape,
                                     at::ScalarType dtype, const std::string& what) {
  if (at::isIntegralType(dtype, /*includeBool=*/true))
    for (double d : values)
      if (!is_whole_number(d))
        throw ValueError(what + " expects integers (" + dtype_to_string(dtype) + "); received " + std::to_string(d));
  return numbers_to_tensor(values, shape, dtype);
}

at::Tensor json_to_tensor(const Json& value, at::ScalarType dtype, const std::string& what, JsonNumberOptions options) {
  NestedNumbers n = json_to_numbers(value, what, options);
  return checked_numbers_to_tensor(n.values, n.shape, dtype, what);
}

namespace {

// Shortest round-trip text of `v` in its own precision; null for NaN/Inf
// (or the literals).
template <class Float>
void append_float_json(std::string& out, Float v, JsonWriteOptions o) {
  if (!std::isfinite(v)) {
    if (!o.non_finite_literals)
      out += "null";
    else if (std::isnan(v))
      out += "NaN";
    else
      out += std::signbit(v) ? "-Infinity" : "Infinity";
    return;
  }
  char buf[40];
  if (!o.tf_serving_decimals) {
    auto r = std::to_chars(buf, buf + sizeof buf, v);
    out.append(buf, r.ptr);
    return;
  }
  // std::to_chars(general, precision) is printf's %.<precision>g.
  auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::general, 6);
  Float back = 0;
  std::from_chars(buf, r.ptr, back);
  if (back != v)
    r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::general, std::numeric_limits<Float>::max_digits10);
  const std::string_view text(buf, r.ptr - buf);
  out += text;
  if (text.find('.') == std::string_view::npos && text.find('e') == std::string_view::npos) out += ".0";
}

}  // namespace

void append_json_number(std::string& out, float v, JsonWriteOptions o) { append_float_json(out, v, o); }

void append_json_number(std::string& out, double v, JsonWriteOptions o) { append_float_json(out, v, o); }

void append_json_number(std::string& out, int64_t v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

void append_tensor_json(std::string& out, const at::Tensor& t, JsonWriteOptions o) {
  with_elements(t, [&](const auto* p, at::IntArrayRef shape) {
    int64_t i = 0;
    append_lists(out, p, shape, 0, i, o);
  });
}

Json tensor_to_json(const at::Tensor& t) {
  Json out;
  with_elements(t, [&](const auto* p, at::IntArrayRef shape) {
    int64_t i = 0;
    out = dom_lists(p, shape, 0, i);
  });
  return out;
}

}  // namespace kiln
