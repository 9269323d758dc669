#include "kiln/layers/reshaping.h"

#include <algorithm>

#include "kiln/layers/config_fields.h"

namespace kiln {
namespace {
const FieldTable<layers::FlattenOptions>& flatten_fields() {
  static const FieldTable<layers::FlattenOptions> t = {
      field("data_format", &layers::FlattenOptions::data_format).choice({"channels_last", "channels_first"})};
  return t;
}

const FieldTable<layers::ReshapeOptions>& reshape_fields() {
  static const FieldTable<layers::ReshapeOptions> t = {int_list_field<layers::ReshapeOptions>(
      "target_shape", &layers::ReshapeOptions::target_shape,
      [](const std::vector<int64_t>& v) {
        return std::all_of(v.begin(), v.end(), [](int64_t d) { return d == -1 || d >= 1; }) &&
               std::count(v.begin(), v.end(), -1) <= 1;
      },
      "a list of positive integers with at most one -1 (the batch axis excluded)", "a list, batch axis excluded")};
  return t;
}
}  // namespace

// --- Flatten ------------------------------------------------------------------
layers::FlattenOptions layers::FlattenImpl::options_from_config(const Json& config) {
  return read_fields(config, "Flatten", flatten_fields());
}

layers::FlattenImpl::FlattenImpl(const layers::FlattenOptions& o) : layers::FlattenImpl(o, layer_base_config(o.base)) {}

layers::FlattenImpl::FlattenImpl(const Json& config) : layers::FlattenImpl(options_from_config(config), config) {}

layers::FlattenImpl::FlattenImpl(const layers::FlattenOptions& o, const Json& base_config)
    : SimpleLayer(base_config), options_(o) {
  check_fields("Flatten", options_, flatten_fields());
}

at::Tensor layers::FlattenImpl::call1(const at::Tensor& x, bool training) {
  if (x.dim() < 1) throw ShapeError("Flatten '" + name() + "' needs an input with a batch axis");
  at::Tensor t = x;
  if (options_.data_format == "channels_first" && x.dim() > 2) {
    std::vector<int64_t> perm = {0};
    for (int64_t i = 2; i < x.dim(); ++i) perm.push_back(i);
    perm.push_back(1);
    t = x.permute(perm);
  }
  return t.reshape({x.size(0), -1});
}

std::vector<Shape> layers::FlattenImpl::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  const Shape& s = input_shapes.at(0);
  if (s.empty()) throw ShapeError("Flatten '" + name() + "' needs an input with a batch axis");
  Shape rest(s.begin() + 1, s.end());
  return {{s[0], rest.empty() ? 1 : num_elements(rest)}};
}

Json layers::FlattenImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, flatten_fields());
  return j;
}

KILN_REGISTER_LAYER_AS(Flatten, layers::FlattenImpl);

// --- Reshape ------------------------------------------------------------------
layers::ReshapeOptions layers::ReshapeImpl::options_from_config(const Json& config) {
  return read_fields(config, "Reshape", reshape_fields());
}

layers::ReshapeImpl::ReshapeImpl(const layers::ReshapeOptions& o) : layers::ReshapeImpl(o, layer_base_config(o.base)) {}

layers::ReshapeImpl::ReshapeImpl(const Json& config) : layers::ReshapeImpl(options_from_config(config), config) {}

layers::ReshapeImpl::ReshapeImpl(const layers::ReshapeOptions& o, const Json& base_config)
    : SimpleLayer(base_config), options_(o) {
  check_fields("Reshape", options_, reshape_fields());
}

layers::ReshapeImpl::ReshapeImpl(const Shape& target_shape, const Json& extra)
    : layers::ReshapeImpl(merged_config(extra, Json{{"target_shape", target_shape}})) {}

Shape layers::ReshapeImpl::resolve(int64_t n, const Shape& input_shape) const {
  Shape out = options_.target_shape;
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
                     " (" + std::to_string(n) + " values per sample) to target_shape " +
                     shape_to_string(options_.target_shape));
  if (unknown_at >= 0) out[unknown_at] = n / known;
  return out;
}

at::Tensor layers::ReshapeImpl::call1(const at::Tensor& x, bool training) {
  Shape xs = sizes_of(x);
  Shape rest(xs.begin() + 1, xs.end());
  Shape target = resolve(num_elements(rest), xs);
  target.insert(target.begin(), x.size(0));
  return x.reshape(target);
}

std::vector<Shape> layers::ReshapeImpl::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  const Shape& s = input_shapes.at(0);
  Shape rest(s.begin() + 1, s.end());
  Shape out = resolve(num_elements(rest), s);
  out.insert(out.begin(), s[0]);
  return {out};
}

Json layers::ReshapeImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, reshape_fields());
  return j;
}

KILN_REGISTER_LAYER_AS(Reshape, layers::ReshapeImpl);

}  // namespace kiln
