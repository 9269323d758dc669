#include "kiln/layers/noise.h"

#include "kiln/layers/config_fields.h"

namespace kiln {

// --- SpatialDropout2D --------------------------------------------------------------
namespace {
const FieldTable<layers::SpatialDropout2DOptions>& spatial_dropout_fields() {
  using O = layers::SpatialDropout2DOptions;
  static const FieldTable<O> t = {field("rate", &O::rate).in_range(0.0, 1.0).required("a float between 0 and 1"),
                                  field("data_format", &O::data_format).choice({"channels_last", "channels_first"}),
                                  field("seed", &O::seed)};
  return t;
}
}  // namespace

layers::SpatialDropout2DOptions layers::SpatialDropout2DImpl::options_from_config(const Json& config) {
  return read_fields(config, "SpatialDropout2D", spatial_dropout_fields());
}

layers::SpatialDropout2DImpl::SpatialDropout2DImpl(const layers::SpatialDropout2DOptions& o)
    : layers::SpatialDropout2DImpl(o, layer_base_config(o.base)) {}

layers::SpatialDropout2DImpl::SpatialDropout2DImpl(const Json& config)
    : layers::SpatialDropout2DImpl(options_from_config(config), config) {}

layers::SpatialDropout2DImpl::SpatialDropout2DImpl(const layers::SpatialDropout2DOptions& o, const Json& base_config)
    : SimpleLayer(base_config), options_(o), seeds_(o.seed) {
  check_fields("SpatialDropout2D", options_, spatial_dropout_fields());
}

layers::SpatialDropout2DImpl::SpatialDropout2DImpl(double rate, const Json& extra)
    : layers::SpatialDropout2DImpl(merged_config(extra, Json{{"rate", rate}})) {}

at::Tensor layers::SpatialDropout2DImpl::call1(const at::Tensor& x, bool training) {
  if (x.dim() != 4)
    throw ShapeError("SpatialDropout2D '" + name() + "' expects 4-D image batches. Received shape " +
                     shape_to_string(sizes_of(x)));
  const double rate = options_.rate;
  if (!training || rate == 0.0) return x;
  if (rate >= 1.0) return x * 0.0;
  std::vector<int64_t> mask_shape = options_.data_format == "channels_last"
                                        ? std::vector<int64_t>{x.size(0), 1, 1, x.size(3)}
                                        : std::vector<int64_t>{x.size(0), x.size(1), 1, 1};
  at::Tensor keep = at::lt(at::rand(mask_shape, seeds_.generator(), x.options()), 1.0 - rate).to(x.scalar_type());
  return x * keep / (1.0 - rate);
}

std::vector<Shape> layers::SpatialDropout2DImpl::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  if (input_shapes.at(0).size() != 4)
    throw ShapeError("SpatialDropout2D '" + name() + "' expects 4-D image batches. Received shape " +
                     shape_to_string(input_shapes.at(0)));
  return input_shapes;
}

Json layers::SpatialDropout2DImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, spatial_dropout_fields());
  return j;
}

KILN_REGISTER_LAYER_AS(SpatialDropout2D, layers::SpatialDropout2DImpl);

// --- GaussianNoise -------------------------------------------------------------------
layers::GaussianNoiseImpl::GaussianNoiseImpl(const Json& config) : SimpleLayer(config) {
  ConfigReader r(config, "GaussianNoise");
  if (!r.has("stddev")) throw ValueError("GaussianNoise: the config is missing `stddev` (a float between 0 and 1)");
  stddev_ = r.number_in("stddev", 0.0, 0.0, 1.0);
  seeds_ = SeedGenerator::from_config(r);
  r.finish();
}

layers::GaussianNoiseImpl::GaussianNoiseImpl(double stddev, const Json& extra)
    : layers::GaussianNoiseImpl(merged_config(extra, Json{{"stddev", stddev}})) {}

at::Tensor layers::GaussianNoiseImpl::call1(const at::Tensor& x, bool training) {
  if (!training || stddev_ == 0.0) return x;
  // Drawn in float32 at least (bfloat16 normals are coarse), added in x's dtype.
  const at::ScalarType dt = at::promote_types(x.scalar_type(), at::kFloat);
  at::Tensor noise = at::randn(x.sizes(), seeds_.generator(), x.options().dtype(dt)) * stddev_;
  return x + noise.to(x.scalar_type());
}

std::vector<Shape> layers::GaussianNoiseImpl::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  return input_shapes;
}

Json layers::GaussianNoiseImpl::get_config() const {
  Json j = base_config();
  j["stddev"] = stddev_;
  j["seed"] = seeds_.to_json();
  return j;
}

KILN_REGISTER_LAYER_AS(GaussianNoise, layers::GaussianNoiseImpl);

}  // namespace kiln
