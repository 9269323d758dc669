// Dropout: in training, zeroes each input unit with probability `rate` and
// scales the rest by 1/(1-rate); identity at inference (Keras's Dropout).
//
//   auto d = std::make_shared<Dropout>(0.5);
//   y = (*d)(x, /*training=*/true);
//
// Config keys: rate (required, 0 <= rate <= 1), noise_shape (null, or a
// list the size of the input's rank; null entries take the input's size, 1s
// share the mask along that axis), seed (null; accepted for Keras
// compatibility: masks come from LibTorch's default generator, so
// kiln::set_random_seed makes them repeat).
#pragma once

#include <optional>

#include "kiln/layers/layer.h"
#include "kiln/layers/layer_holder.h"
#include "kiln/layers/layer_options.h"

namespace kiln {

namespace layers {

struct DropoutOptions {
  double rate = 0.0;                 // in [0, 1]
  std::optional<Shape> noise_shape;  // kNone entries take the input's size
  std::optional<int64_t> seed;
  LayerOptions base;
};

class DropoutImpl : public SimpleLayer {
 public:
  explicit DropoutImpl(const DropoutOptions& options);
  explicit DropoutImpl(const Json& config);
  explicit DropoutImpl(double rate, const Json& extra = Json::object());

  std::string class_name() const override { return "Dropout"; }
  bool supports_masking() const override { return true; }  // as Keras: masks pass through
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;
  double rate() const { return options_.rate; }
  // The config's keys as options; ValueError for an unknown key or a bad value.
  static DropoutOptions options_from_config(const Json& config);

 private:
  DropoutImpl(const DropoutOptions& options, const Json& base_config);

  DropoutOptions options_;  // checked: the layer's config
};
KILN_LAYER_HOLDER(Dropout, DropoutOptions);

}  // namespace layers

}  // namespace kiln

#define KILN_LEGACY_LAYERS_DROPOUT_H
#include "kiln/layers/legacy_names.h"
