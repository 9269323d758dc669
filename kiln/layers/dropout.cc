#include "kiln/layers/dropout.h"

#include "kiln/layers/config_reader.h"

namespace kiln {

DropoutOptions Dropout::options_from_config(const Json& config) {
  ConfigReader r(config, "Dropout");
  if (!r.has("rate")) throw ValueError("Dropout: the config is missing `rate` (a float between 0 and 1)");
  DropoutOptions o;
  o.rate = r.number_in("rate", 0.0, 0.0, 1.0);
  if (const Json* ns = r.get("noise_shape")) {
    if (!ns->is_array()) r.invalid("noise_shape", "null or a list of positive integers or nulls");
    Shape s;
    for (auto& d : *ns) {
      if (!d.is_null() && !(d.is_number_integer() && d.get<int64_t>() >= 1))
        r.invalid("noise_shape", "null or a list of positive integers or nulls");
      s.push_back(d.is_null() ? kNone : d.get<int64_t>());
    }
    o.noise_shape = s;
  }
  const Json* seed = r.get("seed");
  if (seed && !seed->is_number_integer()) r.invalid("seed", "null or an integer");
  if (seed) o.seed = seed->get<int64_t>();
  r.finish();
  return o;
}

Dropout::Dropout(const DropoutOptions& o) : Dropout(o, layer_base_config(o.base)) {}

Dropout::Dropout(const Json& config) : Dropout(options_from_config(config), config) {}

Dropout::Dropout(const DropoutOptions& o, const Json& base_config) : SimpleLayer(base_config) {
  rate_ = option_check::in_range("Dropout", "rate", o.rate, 0.0, 1.0);
  if (o.noise_shape)
    for (auto d : *o.noise_shape)
      if (d != kNone && d < 1)
        option_check::invalid("Dropout", "noise_shape", "null or a list of positive integers or nulls",
                              int_list_json(*o.noise_shape));
  noise_shape_ = o.noise_shape;
  seed_ = o.seed ? Json(*o.seed) : Json(nullptr);
}

Dropout::Dropout(double rate, const Json& extra) : Dropout(merged_config(extra, Json{{"rate", rate}})) {}

at::Tensor Dropout::call1(const at::Tensor& x, bool training) {
  if (!training || rate_ == 0.0) return x;
  if (rate_ >= 1.0) return x * 0.0;  // keeps the graph; 1/(1-rate) would be inf
  if (!noise_shape_) return at::dropout(x, rate_, /*train=*/true);
  if ((int64_t)noise_shape_->size() != x.dim())
    throw ShapeError("Dropout '" + name() + "': noise_shape " + shape_to_string(*noise_shape_) +
                     " must have one entry per input axis; the input has shape " +
                     shape_to_string(Shape(x.sizes().begin(), x.sizes().end())));
  std::vector<int64_t> mask_shape;
  for (int64_t i = 0; i < x.dim(); ++i) {
    int64_t d = (*noise_shape_)[i] < 0 ? x.size(i) : (*noise_shape_)[i];
    if (d != 1 && d != x.size(i))
      throw ShapeError("Dropout '" + name() + "': noise_shape " + shape_to_string(*noise_shape_) +
                       " does not broadcast to the input's shape " +
                       shape_to_string(Shape(x.sizes().begin(), x.sizes().end())));
    mask_shape.push_back(d);
  }
  at::Tensor keep = at::empty(mask_shape, x.options()).bernoulli_(1.0 - rate_);
  return x * keep / (1.0 - rate_);
}

std::vector<Shape> Dropout::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  return input_shapes;
}

Json Dropout::get_config() const {
  Json j = base_config();
  j["rate"] = rate_;
  j["seed"] = seed_;
  j["noise_shape"] = noise_shape_ ? int_list_json(*noise_shape_) : Json(nullptr);
  return j;
}

KILN_REGISTER_LAYER(Dropout);

}  // namespace kiln
