// Pooling layers with Keras's semantics (channels_last by default).
//
//   MaxPooling2D / AveragePooling2D (and the 1D forms): pool_size (2),
//     strides (null = pool_size), padding ("valid" | "same"), data_format.
//     "same" follows TensorFlow: output ceil(n / stride), padding split with
//     the odd element after; padded cells never win a max and are not counted
//     in an average.
//   GlobalAveragePooling1D/2D, GlobalMaxPooling1D/2D: data_format, keepdims
//     (false): (N, ..., C) -> (N, C), or (N, 1, ..., 1, C) with keepdims.
#pragma once

#include "kiln/layers/layer.h"
#include "kiln/layers/layer_holder.h"
#include "kiln/layers/layer_options.h"

namespace kiln {

namespace layers {

// MaxPooling1D/2D, AveragePooling1D/2D options. A size list holds one value
// for every spatial axis or one per axis.
struct PoolingOptions {
  std::vector<int64_t> pool_size = {2};
  std::vector<int64_t> strides;   // empty: pool_size
  std::string padding = "valid";  // "valid" or "same"
  std::string data_format = "channels_last";
  LayerOptions base;
};

}  // namespace layers
using MaxPooling1DOptions = layers::PoolingOptions;
using MaxPooling2DOptions = layers::PoolingOptions;
using AveragePooling1DOptions = layers::PoolingOptions;
using AveragePooling2DOptions = layers::PoolingOptions;

namespace layers {

// GlobalAverage/MaxPooling1D/2D options.
struct GlobalPoolingOptions {
  std::string data_format = "channels_last";
  bool keepdims = false;
  LayerOptions base;
};

// Shared implementation (rank = number of spatial axes).
class Pooling : public SimpleLayer {
 public:
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;
  const std::vector<int64_t>& pool_size() const { return options_.pool_size; }
  const std::vector<int64_t>& strides() const { return options_.strides; }

 protected:
  Pooling(int rank, bool is_max, const std::string& owner, const PoolingOptions& options, const Json& base_config);
  // The config's keys as options; ValueError for an unknown key or a bad value.
  static PoolingOptions options_from_config(int rank, const std::string& owner, const Json& config);

 private:
  int rank_;
  bool is_max_;
  std::string owner_;
  PoolingOptions options_;  // checked: the layer's config
  bool channels_last_;      // from options_.data_format
};

class MaxPooling1DImpl : public Pooling {
 public:
  explicit MaxPooling1DImpl(const PoolingOptions& options);
  explicit MaxPooling1DImpl(const Json& config);
  explicit MaxPooling1DImpl(int64_t pool_size = 2, int64_t strides = 0, const std::string& padding = "valid",
                            const Json& extra = Json::object());  // strides 0: pool_size
  std::string class_name() const override { return "MaxPooling1D"; }
};
KILN_LAYER_HOLDER(MaxPooling1D, PoolingOptions);

class AveragePooling1DImpl : public Pooling {
 public:
  explicit AveragePooling1DImpl(const PoolingOptions& options);
  explicit AveragePooling1DImpl(const Json& config);
  explicit AveragePooling1DImpl(int64_t pool_size = 2, int64_t strides = 0, const std::string& padding = "valid",
                                const Json& extra = Json::object());
  std::string class_name() const override { return "AveragePooling1D"; }
};
KILN_LAYER_HOLDER(AveragePooling1D, PoolingOptions);

class MaxPooling2DImpl : public Pooling {
 public:
  explicit MaxPooling2DImpl(const PoolingOptions& options);
  explicit MaxPooling2DImpl(const Json& config);
  // Empty strides: pool_size.
  explicit MaxPooling2DImpl(const std::vector<int64_t>& pool_size = {2, 2}, const std::vector<int64_t>& strides = {},
                            const std::string& padding = "valid", const Json& extra = Json::object());
  std::string class_name() const override { return "MaxPooling2D"; }
};
KILN_LAYER_HOLDER(MaxPooling2D, PoolingOptions);

class AveragePooling2DImpl : public Pooling {
 public:
  explicit AveragePooling2DImpl(const PoolingOptions& options);
  explicit AveragePooling2DImpl(const Json& config);
  explicit AveragePooling2DImpl(const std::vector<int64_t>& pool_size = {2, 2},
                                const std::vector<int64_t>& strides = {}, const std::string& padding = "valid",
                                const Json& extra = Json::object());
  std::string class_name() const override { return "AveragePooling2D"; }
};
KILN_LAYER_HOLDER(AveragePooling2D, PoolingOptions);

// Shared implementation of the global poolings.
class GlobalPooling : public SimpleLayer {
 public:
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;

 protected:
  GlobalPooling(int rank, bool is_max, const std::string& owner, const GlobalPoolingOptions& options,
                const Json& base_config);
  static GlobalPoolingOptions options_from_config(const std::string& owner, const Json& config);

 private:
  int rank_;
  bool is_max_;
  std::string owner_;
  GlobalPoolingOptions options_;  // checked: the layer's config
  bool channels_last_;            // from options_.data_format
};

class GlobalAveragePooling1DImpl : public GlobalPooling {
 public:
  explicit GlobalAveragePooling1DImpl(const GlobalPoolingOptions& options);
  explicit GlobalAveragePooling1DImpl(const Json& config = Json::object());
  std::string class_name() const override { return "GlobalAveragePooling1D"; }
};
KILN_LAYER_HOLDER(GlobalAveragePooling1D, GlobalPoolingOptions);
class GlobalAveragePooling2DImpl : public GlobalPooling {
 public:
  explicit GlobalAveragePooling2DImpl(const GlobalPoolingOptions& options);
  explicit GlobalAveragePooling2DImpl(const Json& config = Json::object());
  std::string class_name() const override { return "GlobalAveragePooling2D"; }
};
KILN_LAYER_HOLDER(GlobalAveragePooling2D, GlobalPoolingOptions);
class GlobalMaxPooling1DImpl : public GlobalPooling {
 public:
  explicit GlobalMaxPooling1DImpl(const GlobalPoolingOptions& options);
  explicit GlobalMaxPooling1DImpl(const Json& config = Json::object());
  std::string class_name() const override { return "GlobalMaxPooling1D"; }
};
KILN_LAYER_HOLDER(GlobalMaxPooling1D, GlobalPoolingOptions);
class GlobalMaxPooling2DImpl : public GlobalPooling {
 public:
  explicit GlobalMaxPooling2DImpl(const GlobalPoolingOptions& options);
  explicit GlobalMaxPooling2DImpl(const Json& config = Json::object());
  std::string class_name() const override { return "GlobalMaxPooling2D"; }
};
KILN_LAYER_HOLDER(GlobalMaxPooling2D, GlobalPoolingOptions);

}  // namespace layers

}  // namespace kiln

#define KILN_LEGACY_LAYERS_POOLING_H
#include "kiln/layers/legacy_names.h"
