#include "kiln/layers/dropout.h"

#include "kiln/layers/config_fields.h"

namespace kiln {

namespace {
const char kNoiseShapeExpected[] = "null or a list of positive integers or nulls";

FieldDef<layers::DropoutOptions> noise_shape_field() {
  const char* key = "noise_shape";
  return {key,
          [=](ConfigReader& r, layers::DropoutOptions& o) {
            const Json* ns = r.get(key);
            if (!ns) return;
            if (!ns->is_array()) r.invalid(key, kNoiseShapeExpected);
            Shape s;
            for (auto& d : *ns) {
              if (!d.is_null() && !(d.is_number_integer() && d.get<int64_t>() >= 1))
                r.invalid(key, kNoiseShapeExpected);
              s.push_back(d.is_null() ? kNone : d.get<int64_t>());
            }
            o.noise_shape = s;
          },
          [=](const std::string& owner, layers::DropoutOptions& o) {
            if (!o.noise_shape) return;
            for (auto d : *o.noise_shape)
              if (d != kNone && d < 1)
                option_check::invalid(owner, key, kNoiseShapeExpected, int_list_json(*o.noise_shape));
          },
          [=](Json& j, const layers::DropoutOptions& o) {
            j[key] = o.noise_shape ? int_list_json(*o.noise_shape) : Json(nullptr);
          }};
}

// In the order of the config Keras writes (the noise shape is read before the seed).
const FieldTable<layers::DropoutOptions>& dropout_fields() {
  static const FieldTable<layers::DropoutOptions> t = {
      field("rate", &layers::DropoutOptions::rate).in_range(0.0, 1.0).required("a float between 0 and 1"),
      field("seed", &layers::DropoutOptions::seed), noise_shape_field()};
  return t;
}
}  // namespace

layers::DropoutOptions layers::DropoutImpl::options_from_config(const Json& config) {
  return read_fields(config, "Dropout", dropout_fields());
}

layers::DropoutImpl::DropoutImpl(const layers::DropoutOptions& o) : layers::DropoutImpl(o, layer_base_config(o.base)) {}

layers::DropoutImpl::DropoutImpl(const Json& config) : layers::DropoutImpl(options_from_config(config), config) {}

layers::DropoutImpl::DropoutImpl(const layers::DropoutOptions& o, const Json& base_config)
    : SimpleLayer(base_config), options_(o) {
  check_fields("Dropout", options_, dropout_fields());
}

layers::DropoutImpl::DropoutImpl(double rate, const Json& extra)
    : layers::DropoutImpl(merged_config(extra, Json{{"rate", rate}})) {}

at::Tensor layers::DropoutImpl::call1(const at::Tensor& x, bool training) {
  const double rate = options_.rate;
  const std::optional<Shape>& noise_shape = options_.noise_shape;
  if (!training || rate == 0.0) return x;
  if (rate >= 1.0) return x * 0.0;  // keeps the graph; 1/(1-rate) would be inf
  if (!noise_shape) return at::dropout(x, rate, /*train=*/true);
  if ((int64_t)noise_shape->size() != x.dim())
    throw ShapeError("Dropout '" + name() + "': noise_shape " + shape_to_string(*noise_shape) +
                     " must have one entry per input axis; the input has shape " +
                     shape_to_string(Shape(x.sizes().begin(), x.sizes().end())));
  std::vector<int64_t> mask_shape;
  for (int64_t i = 0; i < x.dim(); ++i) {
    int64_t d = (*noise_shape)[i] < 0 ? x.size(i) : (*noise_shape)[i];
    if (d != 1 && d != x.size(i))
      throw ShapeError("Dropout '" + name() + "': noise_shape " + shape_to_string(*noise_shape) +
                       " does not broadcast to the input's shape " +
                       shape_to_string(Shape(x.sizes().begin(), x.sizes().end())));
    mask_shape.push_back(d);
  }
  at::Tensor keep = at::empty(mask_shape, x.options()).bernoulli_(1.0 - rate);
  return x * keep / (1.0 - rate);
}

std::vector<Shape> layers::DropoutImpl::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  return input_shapes;
}

Json layers::DropoutImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, dropout_fields());
  return j;
}

KILN_REGISTER_LAYER_AS(Dropout, layers::DropoutImpl);

}  // namespace kiln
