#include "kiln/layers/reshaping.h"

#include "kiln/layers/config_reader.h"

namespace kiln {
// --- Flatten ------------------------------------------------------------------
Flatten::Flatten(const Json& config) : SimpleLayer(config) {
  ConfigReader r(config, "Flatten");
  data_format_ = r.choice("data_format", "channels_last", {"channels_last", "channels_first"});
  r.finish();
}

at::Tensor Flatten::call1(const at::Tensor& x, bool training) {
  if (x.dim() < 1) throw ShapeError("Flatten '" + name() + "' needs an input with a batch axis");
  at::Tensor t = x;
  if (data_format_ == "channels_first" && x.dim() > 2) {
    std::vector<int64_t> perm = {0};
    for (int64_t i = 2; i < x.dim(); ++i) perm.push_back(i);
    perm.push_back(1);
    t = x.permute(perm);
  }
  return t.reshape({x.size(0), -1});
}

std::vector<Shape> Flatten::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  const Shape& s = input_shapes.at(0);
  if (s.empty()) throw ShapeError("Flatten '" + name() + "' needs an input with a batch axis");
  Shape rest(s.begin() + 1, s.end());
  return {{s[0], rest.empty() ? 1 : num_elements(rest)}};
}

Json Flatten::get_config() const {
  Json j = base_config();
  j["data_format"] = data_format_;
  return j;
}

KILN_REGISTER_LAYER(Flatten);

// --- Reshape ------------------------------------------------------------------
Reshape::Reshape(const Json& config) : SimpleLayer(config) {
  ConfigReader r(config, "Reshape");
  const Json* t = r.get("target_shape");
  if (!t) throw ValueError("Reshape: the config is missing `target_shape` (a list, batch axis excluded)");
  const std::string expected = "a list of positive integers with at most one -1 (the batch axis excluded)";
  if (!t->is_array()) r.invalid("target_shape", expected);
  int unknown = 0;
  for (auto& d : *t) {
    if (!d.is_number_integer()) r.invalid("target_shape", expected);
    int64_t v = d.get<int64_t>();
    if (v == -1)
      ++unknown;
    else if (v < 1)
      r.invalid("target_shape", expected);
    target_.push_back(v);
  }
  if (unknown > 1) r.invalid("target_shape", expected);
  r.finish();
}

Reshape::Reshape(const Shape& target_shape, const Json& extra)
    : Reshape(merged_config(extra, Json{{"target_shape", target_shape}})) {}

Shape Reshape::resolve(int64_t n, const Shape& input_shape) const {
  Shape out = target_;
  int64_t known = 1;
  int64_t unknown_at = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1)
      unknown_at = (int64_t)i;
    else
      known *= out[i];
  }
  if (n < 0) return out;  // stays unknown (kNone == -1)
  if (unknown_at >= 0 ? (known == 0 || n % known != 0) : n != known)
    throw ShapeError("Reshape '" + name() + "': cannot reshape an input of shape " + shape_to_string(input_shape) +
                     " (" + std::to_string(n) + " values per sample) to target_shape " + shape_to_string(target_));
  if (unknown_at >= 0) out[unknown_at] = n / known;
  return out;
}

at::Tensor Reshape::call1(const at::Tensor& x, bool training) {
  Shape xs = sizes_of(x);
  Shape rest(xs.begin() + 1, xs.end());
  Shape target = resolve(num_elements(rest), xs);
  target.insert(target.begin(), x.size(0));
  return x.reshape(target);
}

std::vector<Shape> Reshape::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  const Shape& s = input_shapes.at(0);
  Shape rest(s.begin() + 1, s.end());
  Shape out = resolve(num_elements(rest), s);
  out.insert(out.begin(), s[0]);
  return {out};
}

Json Reshape::get_config() const {
  Json j = base_config();
  j["target_shape"] = target_;
  return j;
}

KILN_REGISTER_LAYER(Reshape);

}  // namespace kiln
