// Every layer through the conformance harness (kiln/testing/layer_conformance.h).
// A new layer is one entry in all_cases(); RegistryCoverage fails until it has one.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <set>

#include "kiln/testing/golden.h"
#include "kiln/testing/layer_conformance.h"
#include "kiln/testing/testing.h"

namespace kiln {

// new_layers_test.cc: issue #10's image, activation, noise, augmentation and
// categorical layers.
std::vector<LayerTestCase> new_layer_cases();

namespace {

struct CaseBuilder {
  LayerTestCase c;
  CaseBuilder(std::string name, const std::string& cls, const Json& config) {
    c.name = std::move(name);
    c.make = from_config(cls, config);
  }
  CaseBuilder& in(std::vector<Shape> shapes) { return c.input_shapes = std::move(shapes), *this; }
  CaseBuilder& out(std::vector<Shape> shapes) { return c.expected_output_shapes = std::move(shapes), *this; }
  CaseBuilder& params(int64_t trainable, int64_t non_trainable = 0) {
    c.expected_trainable_params = trainable;
    c.expected_non_trainable_params = non_trainable;
    return *this;
  }
  CaseBuilder& dtypes(std::vector<at::ScalarType> d, int64_t high) {
    c.input_dtypes = std::move(d);
    c.int_input_high = high;
    return *this;
  }
  CaseBuilder& skip_input_gradients(std::string why) { return c.skip_input_gradients = std::move(why), *this; }
  CaseBuilder& mixed_tolerance(double t) { return c.mixed_tolerance = t, *this; }
  operator LayerTestCase() const { return c; }
};

std::vector<LayerTestCase> all_cases() {
  std::vector<LayerTestCase> cases;
  auto add = [&](const CaseBuilder& b) { cases.push_back(b); };

  // --- core ---
  add(CaseBuilder("Dense_3", "Dense", {{"units", 3}}).in({{2, 4}}).out({{2, 3}}).params(15));
  add(CaseBuilder("Dense_rank3_relu_nobias_l2", "Dense",
                  {{"units", 3}, {"activation", "relu"}, {"use_bias", false}, {"kernel_regularizer", "l2"}})
          .in({{2, 5, 4}})
          .out({{2, 5, 3}})
          .params(12));
  for (const char* a : {"linear", "relu", "relu6", "gelu", "sigmoid", "hard_sigmoid", "tanh", "softmax", "log_softmax",
                        "silu", "swish", "leaky_relu", "elu", "selu", "softplus", "softsign", "exponential", "mish"})
    add(CaseBuilder(std::string("Activation_") + a, "Activation", {{"activation", a}}).in({{2, 5}}).out({{2, 5}}));
  add(CaseBuilder("Dropout_0.5", "Dropout", {{"rate", 0.5}}).in({{3, 4}}).out({{3, 4}}));
  add(CaseBuilder("Dropout_noise_shape", "Dropout", {{"rate", 0.3}, {"noise_shape", {nullptr, 1, 4}}})
          .in({{2, 3, 4}})
          .out({{2, 3, 4}}));
  add(CaseBuilder("Flatten", "Flatten", Json::object()).in({{2, 3, 4}}).out({{2, 12}}));
  add(CaseBuilder("Flatten_channels_first", "Flatten", {{"data_format", "channels_first"}})
          .in({{2, 3, 2, 2}})
          .out({{2, 12}}));
  add(CaseBuilder("Reshape", "Reshape", {{"target_shape", {4, -1}}}).in({{2, 12}}).out({{2, 4, 3}}));
  add(CaseBuilder("EinsumDense_dense", "EinsumDense",
                  {{"equation", "ab,bc->ac"}, {"output_shape", 3}, {"bias_axes", "c"}})
          .in({{2, 4}})
          .out({{2, 3}})
          .params(15));
  add(CaseBuilder("EinsumDense_heads", "EinsumDense",
                  {{"equation", "abc,cde->abde"}, {"output_shape", {nullptr, 2, 3}}, {"bias_axes", "de"}})
          .in({{2, 5, 4}})
          .out({{2, 5, 2, 3}})
          .params(30));
  add(CaseBuilder("EinsumDense_ellipsis", "EinsumDense", {{"equation", "...b,bc->...c"}, {"output_shape", {3}}})
          .in({{2, 5, 4}})
          .out({{2, 5, 3}})
          .params(12));

  // --- convolution and pooling ---
  add(CaseBuilder("Conv1D_valid", "Conv1D", {{"filters", 4}, {"kernel_size", 3}})
          .in({{2, 7, 3}})
          .out({{2, 5, 4}})
          .params(40));
  add(CaseBuilder(
          "Conv1D_causal_dilated", "Conv1D",
          {{"filters", 4}, {"kernel_size", 3}, {"padding", "causal"}, {"dilation_rate", 2}, {"activation", "tanh"}})
          .in({{2, 7, 3}})
          .out({{2, 7, 4}})
          .params(40));
  add(CaseBuilder("Conv2D_valid", "Conv2D", {{"filters", 4}, {"kernel_size", 3}})
          .in({{2, 6, 6, 3}})
          .out({{2, 4, 4, 4}})
          .params(112));
  add(CaseBuilder("Conv2D_same_strided", "Conv2D",
                  {{"filters", 3}, {"kernel_size", {3, 3}}, {"strides", 2}, {"padding", "same"}})
          .in({{2, 5, 5, 2}})
          .out({{2, 3, 3, 3}})
          .params(57));
  add(CaseBuilder(
          "Conv2D_channels_first_grouped_dilated", "Conv2D",
          {{"filters", 4}, {"kernel_size", 3}, {"dilation_rate", 2}, {"groups", 2}, {"data_format", "channels_first"}})
          .in({{2, 4, 7, 7}})
          .out({{2, 4, 3, 3}})
          .params(76));
  add(CaseBuilder("MaxPooling2D", "MaxPooling2D", Json::object()).in({{2, 4, 4, 3}}).out({{2, 2, 2, 3}}));
  add(CaseBuilder("MaxPooling2D_same", "MaxPooling2D", {{"pool_size", 3}, {"strides", 2}, {"padding", "same"}})
          .in({{2, 5, 5, 2}})
          .out({{2, 3, 3, 2}}));
  add(CaseBuilder("AveragePooling2D", "AveragePooling2D", Json::object()).in({{2, 4, 4, 3}}).out({{2, 2, 2, 3}}));
  add(CaseBuilder("AveragePooling2D_same", "AveragePooling2D", {{"pool_size", 2}, {"strides", 1}, {"padding", "same"}})
          .in({{2, 3, 3, 1}})
          .out({{2, 3, 3, 1}}));
  add(CaseBuilder("MaxPooling1D", "MaxPooling1D", Json::object()).in({{2, 6, 3}}).out({{2, 3, 3}}));
  add(CaseBuilder("AveragePooling1D_same", "AveragePooling1D", {{"pool_size", 3}, {"strides", 2}, {"padding", "same"}})
          .in({{2, 5, 3}})
          .out({{2, 3, 3}}));
  add(CaseBuilder("GlobalAveragePooling1D", "GlobalAveragePooling1D", Json::object()).in({{2, 5, 3}}).out({{2, 3}}));
  add(CaseBuilder("GlobalAveragePooling2D", "GlobalAveragePooling2D", Json::object()).in({{2, 4, 4, 3}}).out({{2, 3}}));
  add(CaseBuilder("GlobalAveragePooling2D_keepdims_cf", "GlobalAveragePooling2D",
                  {{"keepdims", true}, {"data_format", "channels_first"}})
          .in({{2, 3, 4, 4}})
          .out({{2, 3, 1, 1}}));
  add(CaseBuilder("GlobalMaxPooling1D", "GlobalMaxPooling1D", Json::object()).in({{2, 5, 3}}).out({{2, 3}}));
  add(CaseBuilder("GlobalMaxPooling2D", "GlobalMaxPooling2D", Json::object()).in({{2, 4, 4, 3}}).out({{2, 3}}));

  // --- normalization ---
  add(CaseBuilder("BatchNormalization", "BatchNormalization", Json::object()).in({{4, 3}}).out({{4, 3}}).params(6, 6));
  add(CaseBuilder("BatchNormalization_image", "BatchNormalization", Json::object())
          .in({{2, 3, 3, 4}})
          .out({{2, 3, 3, 4}})
          .params(8, 8));
  add(CaseBuilder("BatchNormalization_axis1_noscale", "BatchNormalization", {{"axis", 1}, {"scale", false}})
          .in({{4, 3, 5}})
          .out({{4, 3, 5}})
          .params(3, 6));
  add(CaseBuilder("LayerNormalization", "LayerNormalization", Json::object())
          .in({{2, 5, 4}})
          .out({{2, 5, 4}})
          .params(8));
  add(CaseBuilder("LayerNormalization_two_axes", "LayerNormalization", {{"axis", {-2, -1}}})
          .in({{2, 3, 4}})
          .out({{2, 3, 4}})
          .params(24));
  add(CaseBuilder("LayerNormalization_middle_axis", "LayerNormalization", {{"axis", 1}})
          .in({{2, 3, 4}})
          .out({{2, 3, 4}})
          .params(6));
  add(CaseBuilder("LayerNormalization_rms", "LayerNormalization", {{"rms_scaling", true}})
          .in({{2, 5, 4}})
          .out({{2, 5, 4}})
          .params(4));

  // --- embedding and attention ---
  add(CaseBuilder("Embedding", "Embedding", {{"input_dim", 10}, {"output_dim", 4}})
          .in({{2, 5}})
          .dtypes({at::kLong}, 10)
          .out({{2, 5, 4}})
          .params(40)
          .skip_input_gradients("integer ids are not differentiable"));
  add(CaseBuilder("MultiHeadAttention", "MultiHeadAttention", {{"num_heads", 2}, {"key_dim", 3}})
          .in({{2, 4, 5}, {2, 6, 5}})
          .out({{2, 4, 5}})
          .params(143));
  add(CaseBuilder("MultiHeadAttention_key_value_dims", "MultiHeadAttention",
                  {{"num_heads", 2}, {"key_dim", 3}, {"value_dim", 2}, {"output_shape", 6}})
          .in({{2, 4, 5}, {2, 6, 3}, {2, 6, 7}})
          .out({{2, 4, 6}})
          .params(130));
  add(CaseBuilder("MultiHeadAttention_nobias_dropout", "MultiHeadAttention",
                  {{"num_heads", 1}, {"key_dim", 2}, {"use_bias", false}, {"dropout", 0.25}})
          .in({{2, 3, 4}, {2, 3, 4}})
          .out({{2, 3, 4}})
          .params(32));

  // --- merging ---
  for (const char* m : {"Add", "Multiply", "Average", "Maximum", "Minimum"})
    add(CaseBuilder(m, m, Json::object()).in({{2, 3}, {2, 3}, {2, 3}}).out({{2, 3}}));
  add(CaseBuilder("Add_broadcast", "Add", Json::object()).in({{2, 3, 4}, {2, 1, 4}}).out({{2, 3, 4}}));
  add(CaseBuilder("Subtract", "Subtract", Json::object()).in({{2, 3}, {2, 3}}).out({{2, 3}}));
  add(CaseBuilder("Concatenate", "Concatenate", Json::object()).in({{2, 3}, {2, 4}}).out({{2, 7}}));
  add(CaseBuilder("Concatenate_axis1", "Concatenate", {{"axis", 1}}).in({{2, 2, 3}, {2, 4, 3}}).out({{2, 6, 3}}));

  // --- preprocessing ---
  add(CaseBuilder("Rescaling", "Rescaling", {{"scale", 0.5}, {"offset", 1.0}}).in({{2, 3}}).out({{2, 3}}));
  add(CaseBuilder("Rescaling_uint8", "Rescaling", {{"scale", 1.0 / 255}})
          .in({{2, 4}})
          .dtypes({at::kByte}, 256)
          .out({{2, 4}}));
  add(CaseBuilder("Normalization", "Normalization", Json::object()).in({{4, 3}}).out({{4, 3}}).params(0, 7));
  add(CaseBuilder("Normalization_axis_null", "Normalization", {{"axis", nullptr}})
          .in({{4, 3}})
          .out({{4, 3}})
          .params(0, 3));
  add(CaseBuilder("Normalization_given", "Normalization", {{"mean", {1.0, 2.0, 3.0}}, {"variance", {4.0, 1.0, 0.25}}})
          .in({{4, 3}})
          .out({{4, 3}}));
  for (auto& c : new_layer_cases()) cases.push_back(c);

  // --- recurrent and masking (recurrent_test.cc has their golden and mask tests) ---
  add(CaseBuilder("LSTM", "LSTM", {{"units", 3}}).in({{2, 4, 5}}).out({{2, 3}}).params(108));
  add(CaseBuilder("LSTM_sequences_state_dropout", "LSTM",
                  {{"units", 3},
                   {"return_sequences", true},
                   {"return_state", true},
                   {"dropout", 0.2},
                   {"recurrent_dropout", 0.2},
                   {"unit_forget_bias", false}})
          .in({{2, 4, 5}})
          .out({{2, 4, 3}, {2, 3}, {2, 3}})
          .params(108));
  add(CaseBuilder("GRU", "GRU", {{"units", 3}}).in({{2, 4, 5}}).out({{2, 3}}).params(90));
  add(CaseBuilder("GRU_reset_before_backwards", "GRU",
                  {{"units", 3}, {"reset_after", false}, {"go_backwards", true}, {"return_sequences", true}})
          .in({{2, 4, 5}})
          .out({{2, 4, 3}})
          .params(81));
  add(CaseBuilder("SimpleRNN_state", "SimpleRNN", {{"units", 3}, {"return_state", true}, {"activation", "relu"}})
          .in({{2, 4, 5}})
          .out({{2, 3}, {2, 3}})
          .params(27));
  add(CaseBuilder("Bidirectional_LSTM_concat", "Bidirectional",
                  {{"layer", {{"class_name", "LSTM"}, {"config", {{"units", 3}, {"return_sequences", true}}}}}})
          .in({{2, 4, 5}})
          .out({{2, 4, 6}})
          .params(216));
  for (const char* m : {"sum", "mul", "ave"})
    add(CaseBuilder(std::string("Bidirectional_GRU_") + m, "Bidirectional",
                    {{"layer", {{"class_name", "GRU"}, {"config", {{"units", 3}}}}}, {"merge_mode", m}})
            .in({{2, 4, 5}})
            .out({{2, 3}})
            .params(180));
  add(CaseBuilder("Bidirectional_SimpleRNN_none_state", "Bidirectional",
                  {{"layer", {{"class_name", "SimpleRNN"}, {"config", {{"units", 2}, {"return_state", true}}}}},
                   {"merge_mode", nullptr}})
          .in({{2, 4, 5}})
          .out({{2, 2}, {2, 2}, {2, 2}, {2, 2}})
          .params(32));
  add(CaseBuilder("TimeDistributed_Dense", "TimeDistributed",
                  {{"layer", {{"class_name", "Dense"}, {"config", {{"units", 3}}}}}})
          .in({{2, 4, 5}})
          .out({{2, 4, 3}})
          .params(18));
  add(CaseBuilder("Masking", "Masking", {{"mask_value", 0.5}}).in({{2, 4, 5}}).out({{2, 4, 5}}));
  return cases;
}

class LayerConformance : public ::testing::TestWithParam<LayerTestCase> {};

TEST_P(LayerConformance, PassesHarness) { run_layer_test(GetParam()); }

INSTANTIATE_TEST_SUITE_P(AllLayers, LayerConformance, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<LayerTestCase>& info) {
                           std::string n = info.param.name;
                           for (auto& ch : n)
                             if (!std::isalnum((unsigned char)ch)) ch = '_';
                           return n;
                         });

// Configs with every key set away from its default, beside the cases'
// mostly default ones.
std::vector<std::pair<std::string, Json>> full_configs() {
  const Json kernel = {{"use_bias", false},          {"kernel_initializer", "he_normal"},
                       {"bias_initializer", "ones"}, {"kernel_regularizer", "l2"},
                       {"bias_regularizer", "l1"},   {"activity_regularizer", "l1_l2"}};
  auto with = [](Json base, const Json& more) {
    for (auto it = more.begin(); it != more.end(); ++it) base[it.key()] = it.value();
    return base;
  };
  return {
      {"Dense", with(kernel, {{"units", 4}, {"activation", "relu"}})},
      {"Conv1D", with(kernel, {{"filters", 4}, {"kernel_size", 3}, {"padding", "CAUSAL"}, {"dilation_rate", 2}})},
      {"Conv2D", with(kernel, {{"filters", 4},
                               {"kernel_size", {3, 2}},
                               {"strides", {2, 1}},
                               {"padding", "same"},
                               {"data_format", "channels_first"},
                               {"groups", 2},
                               {"activation", "tanh"}})},
      {"Conv2DTranspose", with(kernel, {{"filters", 3},
                                        {"kernel_size", 3},
                                        {"strides", 2},
                                        {"padding", "same"},
                                        {"output_padding", 1},
                                        {"activation", "relu"}})},
      {"DepthwiseConv2D",
       {{"kernel_size", 3},
        {"depth_multiplier", 2},
        {"padding", "same"},
        {"use_bias", false},
        {"depthwise_initializer", "he_uniform"},
        {"depthwise_regularizer", "l2"},
        {"activity_regularizer", "l1"}}},
      {"SeparableConv2D",
       {{"filters", 5},
        {"kernel_size", {3, 3}},
        {"data_format", "channels_first"},
        {"pointwise_initializer", "zeros"},
        {"pointwise_regularizer", "l1"},
        {"bias_regularizer", "l2"}}},
      {"ReLU", {{"max_value", 6.0}, {"negative_slope", 0.1}, {"threshold", 0.5}}},
      {"LeakyReLU", {{"negative_slope", 0.2}}},
      {"Softmax", {{"axis", {1, 2}}}},
      {"BatchNormalization",
       {{"axis", 1},
        {"momentum", 0.9},
        {"epsilon", 1e-5},
        {"center", false},
        {"scale", false},
        {"beta_initializer", "ones"},
        {"gamma_initializer", "zeros"},
        {"moving_mean_initializer", "ones"},
        {"moving_variance_initializer", "zeros"},
        {"beta_regularizer", "l2"},
        {"gamma_regularizer", "l1"},
        {"synchronized", true}}},
      {"LayerNormalization",
       {{"axis", {1, 2}},
        {"epsilon", 1e-5},
        {"center", false},
        {"rms_scaling", true},
        {"beta_initializer", "ones"},
        {"gamma_regularizer", "l2"}}},
      {"GroupNormalization",
       {{"groups", -1},
        {"axis", 1},
        {"epsilon", 1e-5},
        {"center", false},
        {"beta_initializer", "ones"},
        {"gamma_initializer", "zeros"},
        {"beta_regularizer", "l1"},
        {"gamma_regularizer", "l2"}}},
      {"Dropout", {{"rate", 0.25}, {"noise_shape", {nullptr, 1, 4}}, {"seed", 7}}},
      {"SpatialDropout2D", {{"rate", 0.25}, {"data_format", "channels_first"}, {"seed", 7}}},
      {"MultiHeadAttention", with(kernel, {{"num_heads", 2},
                                           {"key_dim", 4},
                                           {"value_dim", 3},
                                           {"dropout", 0.1},
                                           {"output_shape", {2, 3}},
                                           {"seed", 5},
                                           {"use_causal_mask", true}})},
      {"Embedding",
       {{"input_dim", 10},
        {"output_dim", 3},
        {"embeddings_initializer", "zeros"},
        {"embeddings_regularizer", "l2"},
        {"activity_regularizer", "l1"},
        {"mask_zero", true}}},
      {"LSTM",
       {{"units", 3},
        {"activation", "relu"},
        {"recurrent_activation", "hard_sigmoid"},
        {"use_bias", false},
        {"kernel_initializer", "he_normal"},
        {"recurrent_initializer", "glorot_uniform"},
        {"unit_forget_bias", false},
        {"kernel_regularizer", "l2"},
        {"recurrent_regularizer", "l1"},
        {"activity_regularizer", "l1"},
        {"dropout", 0.1},
        {"recurrent_dropout", 0.2},
        {"seed", 3},
        {"return_sequences", true},
        {"return_state", true},
        {"go_backwards", true},
        {"use_cudnn", false},
        {"zero_output_for_mask", true}}},
      {"GRU", {{"units", 3}, {"reset_after", false}, {"bias_initializer", "ones"}, {"bias_regularizer", "l2"}}},
      {"SimpleRNN", {{"units", 3}, {"activation", "relu"}, {"unroll", true}}},
      {"MaxPooling2D", {{"pool_size", {3, 2}}, {"strides", 1}, {"padding", "same"}, {"data_format", "channels_first"}}},
      {"AveragePooling1D", {{"pool_size", 3}, {"strides", 2}}},
      {"GlobalAveragePooling2D", {{"data_format", "channels_first"}, {"keepdims", true}}},
  };
}

// Every case's config and full_configs(), byte for byte against
// testdata/layer_configs_golden.json: a saved model.json stays the same when
// a layer's config code changes. KILN_WRITE_CONFIG_GOLDEN=<file> writes the
// configs there instead (to make the golden file from a known-good build).
TEST(LayerConformanceCoverage, ConfigsMatchGolden) {
  Json actual = Json::object();
  auto add = [&](const std::string& key, const LayerPtr& layer) {
    Json c = layer->get_config();
    c.erase("name");  // a counter's, which depends on the tests run before
    actual[key] = layer->class_name() + " " + c.dump();
  };
  for (auto& c : all_cases()) add(c.name, c.make());
  for (auto& [cls, config] : full_configs()) add(cls + "_full", from_config(cls, config)());
  if (write_or_expect_golden_configs(actual, "kiln/layers/testdata/layer_configs_golden.json"))
    GTEST_SKIP() << "wrote the golden configs";
}

// Every registered layer has at least one conformance case.
TEST(LayerConformanceCoverage, EveryRegisteredLayerHasACase) {
  std::set<std::string> covered;
  for (auto& c : all_cases()) covered.insert(c.make()->class_name());
  const std::set<std::string> containers = {"InputLayer", "Sequential", "Functional"};
  for (auto& name : LayerRegistry::names()) {
    if (containers.count(name) || name.rfind("TestOnly", 0) == 0) continue;  // harness_test.cc's
    EXPECT_TRUE(covered.count(name)) << name << " is registered but has no conformance case";
  }
  for (const char* required : {"Dense",
                               "Activation",
                               "Dropout",
                               "Flatten",
                               "Reshape",
                               "Conv1D",
                               "Conv2D",
                               "MaxPooling2D",
                               "AveragePooling2D",
                               "GlobalAveragePooling1D",
                               "GlobalAveragePooling2D",
                               "BatchNormalization",
                               "LayerNormalization",
                               "Embedding",
                               "MultiHeadAttention",
                               "EinsumDense",
                               "Add",
                               "Concatenate",
                               "Rescaling",
                               "Normalization"})
    EXPECT_TRUE(covered.count(required)) << required;
}

}  // namespace
}  // namespace kiln
