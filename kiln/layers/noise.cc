#include "kiln/layers/noise.h"

#include "kiln/layers/config_reader.h"

namespace kiln {

// --- SpatialDropout2D --------------------------------------------------------------
SpatialDropout2DOptions SpatialDropout2D::options_from_config(const Json& config) {
  ConfigReader r(config, "SpatialDropout2D");
  if (!r.has("rate")) throw ValueError("SpatialDropout2D: the config is missing `rate` (a float between 0 and 1)");
  SpatialDropout2DOptions o;
  o.rate = r.number_in("rate", 0.0, 0.0, 1.0);
  o.data_format = r.choice("data_format", "channels_last", {"channels_last", "channels_first"});
  const Json* seed = r.get("seed");
  if (seed && !seed->is_number_integer()) r.invalid("seed", "null or an integer");
  if (seed) o.seed = seed->get<int64_t>();
  r.finish();
  return o;
}

SpatialDropout2D::SpatialDropout2D(const SpatialDropout2DOptions& o) : SpatialDropout2D(o, layer_base_config(o.base)) {}

SpatialDropout2D::SpatialDropout2D(const Json& config) : SpatialDropout2D(options_from_config(config), config) {}

SpatialDropout2D::SpatialDropout2D(const SpatialDropout2DOptions& o, const Json& base_config)
    : SimpleLayer(base_config), seeds_(o.seed) {
  rate_ = option_check::in_range("SpatialDropout2D", "rate", o.rate, 0.0, 1.0);
  channels_last_ = option_check::choice("SpatialDropout2D", "data_format", o.data_format,
                                        {"channels_last", "channels_first"}) == "channels_last";
}

SpatialDropout2D::SpatialDropout2D(double rate, const Json& extra)
    : SpatialDropout2D(merged_config(extra, Json{{"rate", rate}})) {}

at::Tensor SpatialDropout2D::call1(const at::Tensor& x, bool training) {
  if (x.dim() != 4)
    throw ShapeError("SpatialDropout2D '" + name() + "' expects 4-D image batches. Received shape " +
                     shape_to_string(sizes_of(x)));
  if (!training || rate_ == 0.0) return x;
  if (rate_ >= 1.0) return x * 0.0;
  std::vector<int64_t> mask_shape = channels_last_ ? std::vector<int64_t>{x.size(0), 1, 1, x.size(3)}
                                                   : std::vector<int64_t>{x.size(0), x.size(1), 1, 1};
  at::Tensor keep = at::lt(at::rand(mask_shape, seeds_.generator(), x.options()), 1.0 - rate_).to(x.scalar_type());
  return x * keep / (1.0 - rate_);
}

std::vector<Shape> SpatialDropout2D::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  if (input_shapes.at(0).size() != 4)
    throw ShapeError("SpatialDropout2D '" + name() + "' expects 4-D image batches. Received shape " +
                     shape_to_string(input_shapes.at(0)));
  return input_shapes;
}

Json SpatialDropout2D::get_config() const {
  Json j = base_config();
  j["rate"] = rate_;
  j["data_format"] = channels_last_ ? "channels_last" : "channels_first";
  j["seed"] = seeds_.to_json();
  return j;
}

KILN_REGISTER_LAYER(SpatialDropout2D);

// --- GaussianNoise -------------------------------------------------------------------
GaussianNoise::GaussianNoise(const Json& config) : SimpleLayer(config) {
  ConfigReader r(config, "GaussianNoise");
  if (!r.has("stddev")) throw ValueError("GaussianNoise: the config is missing `stddev` (a float between 0 and 1)");
  stddev_ = r.number_in("stddev", 0.0, 0.0, 1.0);
  seeds_ = SeedGenerator::from_config(r);
  r.finish();
}

GaussianNoise::GaussianNoise(double stddev, const Json& extra)
    : GaussianNoise(merged_config(extra, Json{{"stddev", stddev}})) {}

at::Tensor GaussianNoise::call1(const at::Tensor& x, bool training) {
  if (!training || stddev_ == 0.0) return x;
  // Drawn in float32 at least (bfloat16 normals are coarse), added in x's dtype.
  const at::ScalarType dt = at::promote_types(x.scalar_type(), at::kFloat);
  at::Tensor noise = at::randn(x.sizes(), seeds_.generator(), x.options().dtype(dt)) * stddev_;
  return x + noise.to(x.scalar_type());
}

std::vector<Shape> GaussianNoise::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  return input_shapes;
}

Json GaussianNoise::get_config() const {
  Json j = base_config();
  j["stddev"] = stddev_;
  j["seed"] = seeds_.to_json();
  return j;
}

KILN_REGISTER_LAYER(GaussianNoise);

}  // namespace kiln
