// ONNX export checked against ONNX Runtime (PyPI's onnxruntime in .venv, run
// by scripts/onnx_run.py): an MLP, a CNN and Functional models give kiln's
// predictions within 1e-4; int8 models within 1e-5, bfloat16 ones within
// 2e-2 (docs/EXPORT.md). Skips with a message when onnxruntime is missing
// (fails instead under KILN_REQUIRE_CHECKS=1, as in CI).
#include "kiln/export/onnx_export.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <map>

#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/core/json.h"
#include "kiln/core/random.h"
#include "kiln/core/string_tensor.h"
#include "kiln/data/datasets.h"
#include "kiln/layers/preprocessing.h"
#include "kiln/layers/text_preprocessing.h"
#include "kiln/models/calibration.h"
#include "kiln/models/functional.h"
#include "kiln/models/sequential.h"
#include "kiln/quantization/int8.h"
#include "kiln/saving/model_io.h"
#include "kiln/testing/testing.h"
#include "kiln_onnx/onnx.pb.h"

namespace kiln::exporter {
namespace {

LayerPtr L(const std::string& cls, const Json& config = Json::object()) {
  return layer_from_json(Json{{"class_name", cls}, {"config", config}});
}

std::string q(const std::string& s) { return "'" + s + "'"; }

// ONNX Runtime is importable by python_path(); returns "" or why it is not.
std::string onnx_runtime_missing() {
  static std::string why = [] {
    auto r = run_command(q(python_path()) + " -c 'import onnxruntime, numpy' 2>&1");
    if (r.exit_code != 0)
      return python_path() +
             " cannot import onnxruntime (bash scripts/setup.sh installs it into .venv): " + r.output.substr(0, 200);
    return std::string();
  }();
  return why;
}

Json tensor_json(const at::Tensor& t) {
  auto c = t.contiguous();
  Json j;
  j["dtype"] = c.scalar_type() == at::kLong ? "int64" : "float32";
  j["shape"] = Json(std::vector<int64_t>(c.sizes().begin(), c.sizes().end()));
  if (c.scalar_type() == at::kLong)
    j["data"] = std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
  else
    j["data"] = std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
  return j;
}

// Runs the ONNX file at `path` in ONNX Runtime on `x`: its outputs in the
// order of kiln's output names, as float32 (empty, with a test failure,
// when it does not run or lacks one).
Tensors onnx_runtime_outputs(const std::string& path, models::Model& model, const Tensors& x, const std::string& what) {
  TempDir dir;
  Json inputs;
  auto names = model.input_names();
  auto dtypes = model.input_dtypes();
  for (size_t i = 0; i < x.size(); ++i) {
    if (i < dtypes.size() && is_string_dtype(dtypes[i])) {  // a real string tensor in ONNX
      auto shape = strings::logical_shape(x[i]);
      inputs[names[i]] = Json{{"dtype", "string"}, {"shape", shape}, {"data", strings::decode(x[i])}};
    } else {
      inputs[names[i]] = tensor_json(x[i]);
    }
  }
  atomic_write_file(dir.path() + "/inputs.json", inputs.dump());
  auto r = run_command(q(python_path()) + " " + q(source_path("scripts/onnx_run.py")) + " " + q(path) + " " +
                       q(dir.path() + "/inputs.json") + " 2>&1");
  if (r.exit_code != 0) ADD_FAILURE() << what << ": " << r.output;
  if (r.exit_code != 0) return {};
  Json got = Json::parse(r.output);
  auto out_names = model.output_names();
  EXPECT_EQ(got.size(), out_names.size()) << what;
  Tensors outs;
  for (auto& name : out_names) {
    if (!got.contains(name)) {
      ADD_FAILURE() << what << ": no output " << name << " in " << r.output.substr(0, 200);
      return {};
    }
    auto& o = got[name];
    outs.push_back(at::tensor(o["data"].get<std::vector<float>>()).reshape(o["shape"].get<std::vector<int64_t>>()));
  }
  return outs;
}

// Runs the ONNX file at `path` in ONNX Runtime on `x` and returns the
// largest absolute difference from `want` over all outputs (by kiln's names).
double max_diff_from_onnx_runtime(const std::string& path, models::Model& model, const Tensors& x, const Tensors& want,
                                  const std::string& what) {
  Tensors got = onnx_runtime_outputs(path, model, x, what);
  if (got.size() != want.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].sizes(), want[i].sizes()) << what;
    if (got[i].sizes() != want[i].sizes()) return INFINITY;
    if (got[i].numel() > 0) worst = std::max(worst, (got[i] - want[i].to(at::kFloat)).abs().max().item<double>());
  }
  return worst;
}

// Exports `model`, runs it in ONNX Runtime on `x` and compares with kiln's
// predictions: every output within `tolerance` (absolute). Returns the
// largest difference seen.
double expect_same_as_onnx_runtime(models::Model& model, const Tensors& x, const std::string& what,
                                   double tolerance = 1e-4) {
  TempDir dir;
  export_onnx(model, dir.path() + "/model.onnx");
  double diff = max_diff_from_onnx_runtime(dir.path() + "/model.onnx", model, x, model.predict(x), what);
  EXPECT_LT(diff, tolerance) << what;
  std::cout << "[ measured ] " << what << ": max |ONNX Runtime - kiln| = " << diff << std::endl;
  return diff;
}

TEST(OnnxExport, MlpMatchesOnnxRuntime) {
  auto why = onnx_runtime_missing();
  if (!why.empty()) KILN_SKIP_OR_FAIL("ONNX Runtime check skipped: " << why);
  set_random_seed(1);
  auto m = models::Sequential();
  m->add(layers::Input({12}));
  m->add(L("Rescaling", {{"scale", 0.5}, {"offset", 0.1}}));
  m->add(L("Dense", {{"units", 16}, {"activation", "relu"}}));
  m->add(L("Dropout", {{"rate", 0.3}}));
  m->add(L("Dense", {{"units", 16}, {"activation", "gelu"}}));
  m->add(L("Dense", {{"units", 16}, {"activation", "silu"}}));
  m->add(L("Dense", {{"units", 16}, {"activation", "leaky_relu"}}));
  m->add(L("Dense", {{"units", 16}, {"activation", "elu"}}));
  m->add(L("Dense", {{"units", 16}, {"activation", "tanh"}}));
  m->add(L("Activation", {{"activation", "sigmoid"}}));
  m->add(L("LayerNormalization"));
  m->add(L("Dense", {{"units", 5}, {"activation", "softmax"}}));
  expect_same_as_onnx_runtime(*m, {at::randn({7, 12})}, "MLP");
}

TEST(OnnxExport, CnnMatchesOnnxRuntime) {
  auto why = onnx_runtime_missing();
  if (!why.empty()) KILN_SKIP_OR_FAIL("ONNX Runtime check skipped: " << why);
  set_random_seed(2);
  auto m = models::Sequential();
  m->add(layers::Input({11, 10, 3}));
  m->add(
      L("Conv2D", {{"filters", 6}, {"kernel_size", 3}, {"strides", 2}, {"padding", "same"}, {"activation", "relu"}}));
  auto bn = L("BatchNormalization");
  m->add(bn);
  m->add(L("Conv2D", {{"filters", 4}, {"kernel_size", Json::array({2, 3})}, {"padding", "valid"}}));
  m->add(L("MaxPooling2D", {{"pool_size", 2}, {"padding", "same"}}));
  m->add(L("AveragePooling2D", {{"pool_size", 1}}));
  m->add(L("Reshape", {{"target_shape", Json::array({-1, 4})}}));
  m->add(L("Flatten"));
  m->add(L("Dense", {{"units", 3}}));
  // Non-trivial moving statistics so the folded BatchNormalization is checked.
  for (auto& v : bn->weights())
    v->assign(v->name() == "moving_variance" ? at::rand(v->value().sizes()) + 0.5 : at::randn(v->value().sizes()));
  expect_same_as_onnx_runtime(*m, {at::randn({4, 11, 10, 3})}, "CNN");

  auto g = models::Sequential();
  g->add(layers::Input({8, 8, 2}));
  g->add(L("Conv2D", {{"filters", 3}, {"kernel_size", 3}, {"padding", "same"}}));
  g->add(L("AveragePooling2D", {{"pool_size", 3}, {"strides", 2}, {"padding", "same"}}));
  g->add(L("GlobalAveragePooling2D"));
  expect_same_as_onnx_runtime(*g, {at::randn({2, 8, 8, 2})}, "CNN with same-padded average pooling");
}

TEST(OnnxExport, FunctionalWithAddAndConcatenateMatchesOnnxRuntime) {
  auto why = onnx_runtime_missing();
  if (!why.empty()) KILN_SKIP_OR_FAIL("ONNX Runtime check skipped: " << why);
  set_random_seed(3);
  auto a = layers::Input({6}, at::kFloat, "a");
  auto b = layers::Input({6}, at::kFloat, "b");
  auto norm = layers::Normalization();
  auto na = (*norm)(a);
  auto h1 = (*L("Dense", {{"units", 8}, {"activation", "relu"}}))(na);
  auto h2 = (*L("Dense", {{"units", 8}}))(b);
  auto sum = (*L("Add"))(KerasTensors{h1, h2});
  auto cat = (*L("Concatenate"))(KerasTensors{sum[0], na, b});
  auto shared = L("Dense", {{"units", 4}, {"activation", "tanh"}});
  auto y1 = (*shared)(cat);
  auto y2 = (*L("Dense", {{"units", 2}}))(sum);
  auto model = models::Functional(KerasTensors{a, b}, KerasTensors{y1[0], y2[0]});
  norm->adapt(at::randn({50, 6}) * 3 + 1);
  expect_same_as_onnx_runtime(*model, {at::randn({5, 6}), at::randn({5, 6})}, "Functional");

  auto ids = layers::Input({4}, at::kLong, "ids");
  auto e = (*L("Embedding", {{"input_dim", 10}, {"output_dim", 3}}))(ids);
  auto f = (*L("Flatten"))(e);
  auto emb = models::Functional(KerasTensors{ids}, KerasTensors{(*L("Dense", {{"units", 2}}))(f)});
  expect_same_as_onnx_runtime(*emb, {at::randint(10, {3, 4}, at::kLong)}, "Embedding");
}

TEST(OnnxExport, GraphIsWellFormed) {
  auto m = models::Sequential();
  m->add(layers::Input({3}));
  m->add(L("Dense", {{"units", 2}}));
  kiln_onnx::ModelProto p;
  ASSERT_TRUE(p.ParseFromString(export_onnx_bytes(*m)));
  EXPECT_EQ(p.opset_import(0).version(), 17);
  EXPECT_EQ(p.graph().input(0).name(), m->input_names()[0]);
  EXPECT_EQ(p.graph().output(0).name(), m->output_names()[0]);
  EXPECT_EQ(p.graph().input(0).type().tensor_type().shape().dim(0).dim_param(), "batch");
  EXPECT_EQ(p.graph().initializer_size(), 2);  // kernel, bias
}

TEST(OnnxExport, LayerWithoutOnnxFormIsNamedWithTheAlternative) {
  auto ids = layers::Input({3}, at::kLong, "ids");
  auto h = (*L("Hashing", {{"num_bins", 8}}))(ids);
  auto m =
      models::Functional(KerasTensors{ids}, KerasTensors{(*L("Embedding", {{"input_dim", 8}, {"output_dim", 2}}))(h)});
  const std::string name = m->layers()[1]->name();
  try {
    export_onnx_bytes(*m);
    FAIL() << "Hashing was exported";
  } catch (const ValueError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("layer '" + name + "' (Hashing) has no ONNX export: it hashes"), std::string::npos) << msg;
    EXPECT_NE(msg.find("hash the ids before the model"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  OnnxExportOptions o;
  o.opset = 9;
  EXPECT_THROW(export_onnx_bytes(*m, o), ValueError);
}

// Every registered layer class is exported or listed with the reason it is
// not; docs/EXPORT.md carries the same table (regenerate it from the
// failure message when a layer is added).
TEST(OnnxExport, ConformanceTableCoversTheRegistryAndMatchesTheDocs) {
  int exported = 0, not_exported = 0;
  for (const auto& s : onnx_layer_support()) {
    if (s.exported) {
      ++exported;
      EXPECT_TRUE(s.reason.empty()) << s.class_name << " is exported and also listed without an ONNX form";
    } else {
      ++not_exported;
      EXPECT_FALSE(s.reason.empty()) << "the layer class " << s.class_name
                                     << " is registered but neither exported nor listed with the reason it has no "
                                        "ONNX form: add an exporter (or a reason) in kiln/export/onnx_export.cc";
    }
  }
  std::cout << "[ measured ] registered layer classes: " << exported + not_exported << ", exported: " << exported
            << std::endl;
  const std::string doc = read_file(source_path("docs/EXPORT.md"));
  const std::string begin = "<!-- conformance table: generated by onnx_conformance_table() -->\n";
  const std::string end = "<!-- end of conformance table -->";
  auto a = doc.find(begin), b = doc.find(end);
  ASSERT_NE(a, std::string::npos) << "docs/EXPORT.md lost its conformance table markers";
  ASSERT_NE(b, std::string::npos) << "docs/EXPORT.md lost its conformance table markers";
  EXPECT_EQ(doc.substr(a + begin.size(), b - a - begin.size()), onnx_conformance_table())
      << "docs/EXPORT.md's conformance table is out of date; replace it with:\n"
      << onnx_conformance_table();
}

TEST(OnnxExportCli, ExportsASavedModel) {
  TempDir dir;
  auto m = models::Sequential();
  m->add(layers::Input({4}));
  m->add(L("Dense", {{"units", 3}, {"activation", "softmax"}}));
  m->save(dir.path() + "/m/1");
  auto r = run_command(q(cli_path()) + " export --format onnx --model " + q(dir.path() + "/m/1") + " --output " +
                       q(dir.path() + "/model.onnx") + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  kiln_onnx::ModelProto p;
  ASSERT_TRUE(p.ParseFromString(read_file(dir.path() + "/model.onnx")));
  EXPECT_EQ(p.producer_name(), "kiln");
  r = run_command(q(cli_path()) + " export --format onnx --weights float16 --model " + q(dir.path() + "/m/1") +
                  " --output " + q(dir.path() + "/f16.onnx") + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(p.ParseFromString(read_file(dir.path() + "/f16.onnx")));
  for (auto& init : p.graph().initializer()) EXPECT_EQ(init.data_type(), kiln_onnx::TensorProto::FLOAT16);
  r = run_command(q(cli_path()) + " export --format onnx --optimize --model " + q(dir.path() + "/m/1") + " --output " +
                  q(dir.path() + "/optimized.onnx") + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(p.ParseFromString(read_file(dir.path() + "/optimized.onnx")));
  for (auto& n : p.graph().node()) EXPECT_NE(n.op_type(), "Identity");
  r = run_command(q(cli_path()) + " export --format tflite --model " + q(dir.path() + "/m/1") + " --output x 2>&1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

// --- Every exported layer against ONNX Runtime (float32, 1e-5) -----------

constexpr double kLayerTolerance = 1e-5;

#define SKIP_WITHOUT_ONNX_RUNTIME()                                             \
  do {                                                                          \
    auto why = onnx_runtime_missing();                                          \
    if (!why.empty()) KILN_SKIP_OR_FAIL("ONNX Runtime check skipped: " << why); \
  } while (0)

// A Sequential model of `layers` on inputs of `shape`, with non-zero biases
// (and other weights) so that every term is checked, compared on `x`.
void check_sequential(const Shape& shape, const std::vector<LayerPtr>& layers, const at::Tensor& x,
                      const std::string& what) {
  auto m = models::Sequential();
  m->add(layers::Input(shape));
  for (auto& l : layers) m->add(l);
  for (auto& v : m->weights())
    if (v->name() == "bias" || v->name() == "beta" || v->name() == "alpha" || v->name() == "gamma")
      v->assign(at::randn(v->value().sizes()) * 0.5);
  expect_same_as_onnx_runtime(*m, {x}, what, kLayerTolerance);
}

TEST(OnnxExportLayers, ConvolutionsMatchOnnxRuntime) {
  SKIP_WITHOUT_ONNX_RUNTIME();
  set_random_seed(21);
  for (const std::string padding : {"valid", "same", "causal"})
    check_sequential({13, 3},
                     {L("Conv1D", {{"filters", 4}, {"kernel_size", 3}, {"padding", padding}, {"activation", "relu"}}),
                      L("Conv1D", {{"filters", 5}, {"kernel_size", 2}, {"dilation_rate", 2}, {"padding", padding}})},
                     at::randn({3, 13, 3}), "Conv1D padding " + padding);
  check_sequential(
      {13, 4}, {L("Conv1D", {{"filters", 6}, {"kernel_size", 3}, {"strides", 2}, {"groups", 2}, {"padding", "same"}})},
      at::randn({2, 13, 4}), "Conv1D strides 2, groups 2");
  for (const std::string padding : {"valid", "same"}) {
    check_sequential({9, 8, 3},
                     {L("DepthwiseConv2D", {{"kernel_size", 3},
                                            {"strides", 2},
                                            {"depth_multiplier", 2},
                                            {"padding", padding},
                                            {"activation", "tanh"}})},
                     at::randn({2, 9, 8, 3}), "DepthwiseConv2D padding " + padding);
    check_sequential({9, 8, 3},
                     {L("SeparableConv2D", {{"filters", 5},
                                            {"kernel_size", Json::array({3, 2})},
                                            {"depth_multiplier", 2},
                                            {"padding", padding},
                                            {"dilation_rate", 2}})},
                     at::randn({2, 9, 8, 3}), "SeparableConv2D padding " + padding);
    for (int strides : {1, 2})
      check_sequential(
          {5, 6, 3},
          {L("Conv2DTranspose",
             {{"filters", 4}, {"kernel_size", 3}, {"strides", strides}, {"padding", padding}, {"activation", "relu"}})},
          at::randn({2, 5, 6, 3}), "Conv2DTranspose padding " + padding + ", strides " + std::to_string(strides));
  }
  check_sequential(
      {5, 6, 3},
      {L("Conv2DTranspose",
         {{"filters", 2}, {"kernel_size", 3}, {"strides", 2}, {"padding", "same"}, {"output_padding", 1}})},
      at::randn({2, 5, 6, 3}), "Conv2DTranspose output_padding 1");
  check_sequential({5, 6, 3},
                   {L("Conv2DTranspose", {{"filters", 2}, {"kernel_size", 2}, {"strides", 3}, {"padding", "valid"}})},
                   at::randn({2, 5, 6, 3}), "Conv2DTranspose strides beyond the kernel");
}

TEST(OnnxExportLayers, PoolingAndReshapingMatchOnnxRuntime) {
  SKIP_WITHOUT_ONNX_RUNTIME();
  set_random_seed(22);
  for (const std::string padding : {"valid", "same"})
    check_sequential({11, 4},
                     {L("MaxPooling1D", {{"pool_size", 3}, {"strides", 2}, {"padding", padding}}),
                      L("AveragePooling1D", {{"pool_size", 2}, {"padding", padding}})},
                     at::randn({3, 11, 4}), "1D pooling padding " + padding);
  check_sequential({7, 4}, {L("GlobalAveragePooling1D")}, at::randn({3, 7, 4}), "GlobalAveragePooling1D");
  check_sequential({7, 4}, {L("GlobalMaxPooling1D", {{"keepdims", true}})}, at::randn({3, 7, 4}),
                   "GlobalMaxPooling1D keepdims");
  check_sequential({5, 6, 2}, {L("GlobalMaxPooling2D", {{"keepdims", true}})}, at::randn({3, 5, 6, 2}),
                   "GlobalMaxPooling2D keepdims");
  check_sequential(
      {5, 6, 2},
      {L("ZeroPadding2D", {{"padding", Json::array({Json::array({1, 2}), Json::array({0, 3})})}}),
       L("Cropping2D", {{"cropping", Json::array({Json::array({2, 0}), Json::array({1, 1})})}}),
       L("UpSampling2D", {{"size", Json::array({2, 3})}}), L("Permute", {{"dims", Json::array({3, 1, 2})}})},
      at::randn({2, 5, 6, 2}), "ZeroPadding2D, Cropping2D, UpSampling2D nearest, Permute");
  check_sequential({4, 5, 3}, {L("UpSampling2D", {{"size", 2}, {"interpolation", "bilinear"}})},
                   at::randn({2, 4, 5, 3}), "UpSampling2D bilinear");
  check_sequential({6}, {L("RepeatVector", {{"n", 4}}), L("Reshape", {{"target_shape", Json::array({3, 8})}})},
                   at::randn({3, 6}), "RepeatVector, Reshape");
  check_sequential({4, 5, 3},
                   {L("RandomFlip"), L("RandomRotation", {{"factor", 0.2}}),
                    L("RandomTranslation", {{"height_factor", 0.1}, {"width_factor", 0.1}}),
                    L("RandomZoom", {{"height_factor", 0.1}}), L("GaussianNoise", {{"stddev", 0.1}}),
                    L("SpatialDropout2D", {{"rate", 0.2}})},
                   at::randn({2, 4, 5, 3}), "augmentation and noise layers (identity at inference)");
}

TEST(OnnxExportLayers, NormalizationsActivationsAndEinsumDenseMatchOnnxRuntime) {
  SKIP_WITHOUT_ONNX_RUNTIME();
  set_random_seed(23);
  check_sequential({5, 6, 8}, {L("GroupNormalization", {{"groups", 4}})}, at::randn({3, 5, 6, 8}) * 2 + 1,
                   "GroupNormalization");
  check_sequential({8, 5}, {L("GroupNormalization", {{"groups", -1}, {"axis", 1}, {"epsilon", 1e-5}})},
                   at::randn({3, 8, 5}), "GroupNormalization groups -1, axis 1");
  check_sequential({6, 4}, {L("LayerNormalization", {{"axis", Json::array({1, 2})}})}, at::randn({3, 6, 4}),
                   "LayerNormalization over two axes");
  check_sequential({12},
                   {L("ReLU", {{"max_value", 1.5}, {"negative_slope", 0.1}, {"threshold", 0.2}}), L("LeakyReLU"),
                    L("ReLU", {{"negative_slope", 0.05}}), L("Dense", {{"units", 12}}), L("PReLU"), L("Softmax")},
                   at::randn({4, 12}) * 2, "ReLU, LeakyReLU, PReLU, Softmax");
  check_sequential({3, 4}, {L("PReLU", {{"shared_axes", 1}}), L("Softmax", {{"axis", Json::array({1, 2})}})},
                   at::randn({4, 3, 4}), "PReLU shared_axes, Softmax over two axes");
  check_sequential({5, 6},
                   {L("EinsumDense", {{"equation", "abc,cde->abde"},
                                      {"output_shape", Json::array({nullptr, 2, 3})},
                                      {"bias_axes", "de"},
                                      {"activation", "gelu"}}),
                    L("EinsumDense", {{"equation", "abcd,cd->ab"}, {"output_shape", Json::array({5})}})},
                   at::randn({3, 5, 6}), "EinsumDense");
  at::Tensor x = at::randn({3, 6, 4});
  x.index_put_({0, 2}, 0.0);
  x.index_put_({1, 5}, 0.0);
  check_sequential({6, 4}, {L("Masking"), L("Dense", {{"units", 3}})}, x, "Masking (a masked step is zeros)");
}

TEST(OnnxExportLayers, RecurrentLayersMatchOnnxRuntime) {
  SKIP_WITHOUT_ONNX_RUNTIME();
  set_random_seed(24);
  at::Tensor x = at::randn({4, 7, 5});
  for (const std::string cls : {"LSTM", "GRU", "SimpleRNN"})
    for (bool sequences : {false, true})
      for (bool backwards : {false, true}) {
        Json cfg = {{"units", 6}, {"return_sequences", sequences}, {"go_backwards", backwards}};
        check_sequential(
            {7, 5}, {L(cls, cfg)}, x,
            cls + " return_sequences " + std::to_string(sequences) + " go_backwards " + std::to_string(backwards));
      }
  check_sequential({7, 5}, {L("GRU", {{"units", 6}, {"reset_after", false}})}, x, "GRU reset_after false");
  check_sequential({7, 5}, {L("SimpleRNN", {{"units", 6}, {"activation", "relu"}, {"use_bias", false}})}, x,
                   "SimpleRNN relu without bias");
  check_sequential({7, 5}, {L("LSTM", {{"units", 6}, {"activation", "relu"}, {"recurrent_activation", "tanh"}})}, x,
                   "LSTM relu / tanh");

  // return_state and initial states (Functional).
  for (const std::string cls : {"LSTM", "GRU"}) {
    auto seq = layers::Input({7, 5}, at::kFloat, "seq");
    auto h0 = layers::Input({6}, at::kFloat, "h0");
    auto c0 = layers::Input({6}, at::kFloat, "c0");
    KerasTensors ins = {seq, h0};
    if (cls == "LSTM") ins.push_back(c0);
    auto outs = (*L(cls, {{"units", 6}, {"return_sequences", true}, {"return_state", true}}))(ins);
    auto model = models::Functional(ins, outs);
    Tensors xs = {x, at::randn({4, 6})};
    if (cls == "LSTM") xs.push_back(at::randn({4, 6}));
    expect_same_as_onnx_runtime(*model, xs, cls + " return_state with initial states", kLayerTolerance);
  }

  // Bidirectional: one ONNX op (direction "bidirectional"), each merge mode, states.
  for (const std::string cls : {"LSTM", "GRU", "SimpleRNN"})
    for (const Json& mode : {Json("concat"), Json("sum"), Json("mul"), Json("ave")})
      for (bool sequences : {false, true})
        check_sequential(
            {7, 5},
            {L("Bidirectional",
               {{"layer", {{"class_name", cls}, {"config", {{"units", 4}, {"return_sequences", sequences}}}}},
                {"merge_mode", mode}})},
            x,
            "Bidirectional " + cls + " " + mode.get<std::string>() + " return_sequences " + std::to_string(sequences));
  {
    auto seq = layers::Input({7, 5}, at::kFloat, "seq");
    auto bi =
        L("Bidirectional",
          {{"layer",
            {{"class_name", "LSTM"}, {"config", {{"units", 4}, {"return_sequences", true}, {"return_state", true}}}}},
           {"merge_mode", nullptr}});
    auto model = models::Functional(KerasTensors{seq}, (*bi)(KerasTensors{seq}));
    expect_same_as_onnx_runtime(*model, {x}, "Bidirectional LSTM merge_mode null with states", kLayerTolerance);
    kiln_onnx::ModelProto p;
    ASSERT_TRUE(p.ParseFromString(export_onnx_bytes(*model)));
    int lstm = 0;
    for (auto& n : p.graph().node()) lstm += n.op_type() == "LSTM";
    EXPECT_EQ(lstm, 1) << "one bidirectional LSTM op";
  }
  {
    // A backward_layer of its own: two ONNX ops.
    auto bi =
        L("Bidirectional",
          {{"layer", {{"class_name", "GRU"}, {"config", {{"units", 4}, {"return_sequences", true}}}}},
           {"backward_layer",
            {{"class_name", "GRU"}, {"config", {{"units", 3}, {"return_sequences", true}, {"go_backwards", true}}}}}});
    check_sequential({7, 5}, {bi}, x, "Bidirectional GRU with its own backward_layer");
  }
  check_sequential({7, 5},
                   {L("TimeDistributed", {{"layer", {{"class_name", "Dense"}, {"config", {{"units", 3}}}}}}),
                    L("SimpleRNN", {{"units", 2}})},
                   x, "TimeDistributed(Dense), SimpleRNN");
}

TEST(OnnxExportLayers, CategoryEncodingMatchesOnnxRuntime) {
  SKIP_WITHOUT_ONNX_RUNTIME();
  for (const std::string mode : {"one_hot", "multi_hot", "count"})
    for (int64_t k : {1, 3}) {
      auto ids = layers::Input({k}, at::kLong, "ids");
      auto y = (*L("CategoryEncoding", {{"num_tokens", 6}, {"output_mode", mode}}))(ids);
      auto model = models::Functional(KerasTensors{ids}, KerasTensors{y});
      at::Tensor x = at::randint(6, {5, k}, at::kLong);
      x[0].fill_(2);  // repeated ids count twice
      expect_same_as_onnx_runtime(*model, {x}, "CategoryEncoding " + mode + " on " + std::to_string(k) + " ids",
                                  kLayerTolerance);
    }
}

TEST(OnnxExportLayers, ResizingMatchesOnnxRuntime) {
  SKIP_WITHOUT_ONNX_RUNTIME();
  set_random_seed(29);
  for (const std::string interpolation : {"bilinear", "nearest"})
    for (const std::string aspect : {"", "crop_to_aspect_ratio", "pad_to_aspect_ratio"}) {
      Json cfg = {{"height", 7}, {"width", 4}, {"interpolation", interpolation}};
      if (!aspect.empty()) cfg[aspect] = true;
      if (aspect == "pad_to_aspect_ratio") cfg["fill_value"] = 0.5;
      check_sequential({10, 9, 3}, {L("Resizing", cfg)}, at::randn({2, 10, 9, 3}),
                       "Resizing " + interpolation + (aspect.empty() ? "" : ", " + aspect));
      cfg["height"] = 23;  // upsampling too
      cfg["width"] = 13;
      check_sequential({10, 9, 3}, {L("Resizing", cfg)}, at::randn({2, 10, 9, 3}),
                       "Resizing up " + interpolation + (aspect.empty() ? "" : ", " + aspect));
    }
}

TEST(OnnxExportLayers, IntegerLookupMatchesOnnxRuntime) {
  SKIP_WITHOUT_ONNX_RUNTIME();
  set_random_seed(30);
  const Json vocabulary = Json::array({12, 1138, 36, -4, 7});
  for (const Json& extra : {Json::object(), Json{{"num_oov_indices", 3}, {"mask_token", 0}}}) {
    Json cfg = {{"vocabulary", vocabulary}};
    cfg.update(extra);
    auto ids = layers::Input({6}, at::kLong, "ids");
    auto idx = (*L("IntegerLookup", cfg))(ids);
    auto lookup_only = models::Functional(KerasTensors{ids}, KerasTensors{idx});
    auto e = (*L("Embedding", {{"input_dim", 10}, {"output_dim", 3}}))(idx);
    auto model = models::Functional(KerasTensors{ids}, KerasTensors{(*L("Dense", {{"units", 2}}))((*L("Flatten"))(e))});
    at::Tensor x = at::tensor({12, 1138, 36, -4, 7, 0, 5, -9, 36, 1000, 0, 12}, at::kLong).reshape({2, 6});
    expect_same_as_onnx_runtime(*lookup_only, {x}, "IntegerLookup " + extra.dump(), kLayerTolerance);
    expect_same_as_onnx_runtime(*model, {x}, "IntegerLookup, Embedding " + extra.dump(), kLayerTolerance);
  }
}

TEST(OnnxExportLayers, MaskedRecurrentLayerIsRefusedWithTheReason) {
  auto ids = layers::Input({5}, at::kLong, "ids");
  auto e = (*L("Embedding", {{"input_dim", 10}, {"output_dim", 3}, {"mask_zero", true}}))(ids);
  auto lstm = L("LSTM", {{"units", 2}});
  auto model = models::Functional(KerasTensors{ids}, KerasTensors{(*lstm)(e)});
  try {
    export_onnx_bytes(*model);
    FAIL() << "a masked LSTM was exported";
  } catch (const ValueError& err) {
    std::string msg = err.what();
    EXPECT_NE(msg.find("layer '" + lstm->name() + "' (LSTM) receives a mask"), std::string::npos) << msg;
    EXPECT_NE(msg.find("export a model without the mask"), std::string::npos) << msg;
  }
}

TEST(OnnxExportLayers, MultiHeadAttentionMatchesOnnxRuntime) {
  SKIP_WITHOUT_ONNX_RUNTIME();
  set_random_seed(25);
  for (bool causal : {false, true}) {
    auto x = layers::Input({6, 8}, at::kFloat, "x");
    auto mha = L("MultiHeadAttention", {{"num_heads", 2}, {"key_dim", 4}, {"use_causal_mask", causal}});
    auto model = models::Functional(KerasTensors{x}, (*mha)(KerasTensors{x, x}));
    for (auto& v : model->weights())
      if (v->name() == "bias") v->assign(at::randn(v->value().sizes()) * 0.5);
    expect_same_as_onnx_runtime(*model, {at::randn({3, 6, 8})},
                                std::string("MultiHeadAttention self") + (causal ? ", causal" : ""), kLayerTolerance);
  }
  // Cross attention with a key, value_dim, output_shape and an attention mask (and causal).
  for (bool causal : {false, true}) {
    auto q = layers::Input({5, 8}, at::kFloat, "query");
    auto v = layers::Input({7, 6}, at::kFloat, "value");
    auto k = layers::Input({7, 3}, at::kFloat, "key");
    auto mask = layers::Input({5, 7}, at::kFloat, "attention_mask");
    auto mha =
        L("MultiHeadAttention",
          {{"num_heads", 3}, {"key_dim", 4}, {"value_dim", 2}, {"output_shape", 5}, {"use_causal_mask", causal}});
    auto model = models::Functional(KerasTensors{q, v, k, mask}, (*mha)(KerasTensors{q, v, k, mask}));
    at::Tensor m = (at::rand({2, 5, 7}) > 0.3).to(at::kFloat);
    m.index_put_({0, 1}, 0.0);  // a fully masked query row
    expect_same_as_onnx_runtime(*model, {at::randn({2, 5, 8}), at::randn({2, 7, 6}), at::randn({2, 7, 3}), m},
                                std::string("MultiHeadAttention cross, attention_mask") + (causal ? ", causal" : ""),
                                kLayerTolerance);
  }
}

TEST(OnnxExportLayers, NestedModelsMatchOnnxRuntime) {
  SKIP_WITHOUT_ONNX_RUNTIME();
  set_random_seed(26);
  auto inner = models::Sequential();
  inner->add(layers::Input({6}));
  inner->add(L("Dense", {{"units", 5}, {"activation", "relu"}}));
  auto a = layers::Input({6}, at::kFloat, "a");
  auto b = layers::Input({6}, at::kFloat, "b");
  auto sub = (*L("Subtract"))(KerasTensors{(*inner)(a), (*inner)(b)});
  auto model = models::Functional(KerasTensors{a, b}, (*L("Dense", {{"units", 2}}))(sub));
  expect_same_as_onnx_runtime(*model, {at::randn({4, 6}), at::randn({4, 6})}, "a shared nested Sequential",
                              kLayerTolerance);
}

// --- Whole models trained by kiln ---------------------------------------------

// Trains `m` (token ids of length `len` below `vocab` -> 3 classes, the class
// read off one token) for two epochs, then compares it with ONNX Runtime on
// new ids.
void train_and_check(models::Model& m, int64_t vocab, int64_t len, const std::string& what) {
  m.compile("adam", "sparse_categorical_crossentropy");
  at::Tensor ids = at::randint(vocab, {64, len}, at::kLong);
  FitArgs fa;
  fa.x = {ids};
  fa.y = {ids.select(1, len / 2).remainder(3)};
  fa.batch_size = 16;
  fa.epochs = 2;
  fa.verbose = 0;
  m.fit(fa);
  expect_same_as_onnx_runtime(m, {at::randint(vocab, {10, len}, at::kLong)}, what, kLayerTolerance);
}

TEST(OnnxExportModels, LstmTextClassifierMatchesOnnxRuntime) {
  SKIP_WITHOUT_ONNX_RUNTIME();
  set_random_seed(27);
  auto m = models::Sequential();
  m->add(layers::Input({12}, at::kLong));
  m->add(L("Embedding", {{"input_dim", 50}, {"output_dim", 8}}));
  m->add(L("LSTM", {{"units", 16}}));
  m->add(L("Dense", {{"units", 3}, {"activation", "softmax"}}));
  train_and_check(*m, 50, 12, "trained LSTM text classifier");
}

TEST(OnnxExportModels, TransformerEncoderMatchesOnnxRuntime) {
  SKIP_WITHOUT_ONNX_RUNTIME();
  set_random_seed(28);
  auto ids = layers::Input({10}, at::kLong, "tokens");
  auto x = (*L("Embedding", {{"input_dim", 40}, {"output_dim", 16}}))(ids);
  auto attn = (*L("MultiHeadAttention", {{"num_heads", 2}, {"key_dim", 8}}))(KerasTensors{x, x})[0];
  auto h = (*L("LayerNormalization"))((*L("Add"))(KerasTensors{x, attn}))[0];
  auto ff = (*L("Dense", {{"units", 32}, {"activation", "relu"}}))(h);
  ff = (*L("Dense", {{"units", 16}}))(ff);
  h = (*L("LayerNormalization"))((*L("Add"))(KerasTensors{h, ff}))[0];
  auto pooled = (*L("GlobalAveragePooling1D"))(h);
  auto y = (*L("Dense", {{"units", 3}, {"activation", "softmax"}}))(pooled);
  auto m = models::Functional(KerasTensors{ids}, KerasTensors{y});
  train_and_check(*m, 40, 10, "trained transformer encoder block");

  // Saved, then exported by the CLI from the model directory.
  TempDir dir;
  m->save(dir.path() + "/m/1");
  auto r = run_command(q(cli_path()) + " export --format onnx --model " + q(dir.path() + "/m/1") + " --output " +
                       q(dir.path() + "/model.onnx") + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ModelPtr loaded = load_model(dir.path() + "/m/1");
  at::Tensor probe = at::randint(40, {6, 10}, at::kLong);
  double diff = max_diff_from_onnx_runtime(dir.path() + "/model.onnx", *loaded, {probe},
                                           loaded->predict(Tensors{probe}), "kiln export of a saved transformer");
  EXPECT_LT(diff, kLayerTolerance);
  std::cout << "[ measured ] CLI-exported saved transformer: max |ONNX Runtime - kiln| = " << diff << std::endl;
}

// --- float16 weights (OnnxExportOptions::weights) --------------------------

// float16 keeps 11 significant bits: each weight moves by up to 2^-12
// relative; the outputs of these models move by at most 3.7e-4
// (docs/EXPORT.md), the tolerance leaves 5x.
constexpr double kFloat16WeightsTolerance = 2e-3;

// Exports `model` with float32 and with float16 weights: the float16 file is
// at most 0.55x the float32 one, stores every float initializer as float16,
// and ONNX Runtime's outputs of it are within kFloat16WeightsTolerance of
// kiln's on `x`.
void check_float16_weights(models::Model& model, const Tensors& x, const std::string& what) {
  TempDir dir;
  export_onnx(model, dir.path() + "/f32.onnx");
  OnnxExportOptions o;
  o.weights = "float16";
  export_onnx(model, dir.path() + "/f16.onnx", o);
  const std::string f16 = read_file(dir.path() + "/f16.onnx");
  const double ratio = (double)f16.size() / (double)read_file(dir.path() + "/f32.onnx").size();
  EXPECT_LE(ratio, 0.55) << what;
  kiln_onnx::ModelProto p;
  ASSERT_TRUE(p.ParseFromString(f16)) << what;
  int halves = 0;
  for (auto& init : p.graph().initializer()) {
    EXPECT_NE(init.data_type(), kiln_onnx::TensorProto::FLOAT) << what << ": " << init.name();
    halves += init.data_type() == kiln_onnx::TensorProto::FLOAT16;
  }
  EXPECT_GT(halves, 0) << what;
  double diff = max_diff_from_onnx_runtime(dir.path() + "/f16.onnx", model, x, model.predict(x), what);
  EXPECT_LT(diff, kFloat16WeightsTolerance) << what;
  std::cout << "[ measured ] " << what << " with float16 weights: " << f16.size() << " bytes, " << ratio
            << "x the float32 file; max |ONNX Runtime - kiln| = " << diff << std::endl;
}

TEST(OnnxExportFloat16Weights, TrainedMlpCnnAndTransformerMatchOnnxRuntimeAtHalfTheSize) {
  SKIP_WITHOUT_ONNX_RUNTIME();
  set_random_seed(31);
  auto mlp = models::Sequential();
  mlp->add(layers::Input({64}));
  mlp->add(L("Dense", {{"units", 128}, {"activation", "relu"}}));
  mlp->add(L("Dropout", {{"rate", 0.2}}));
  mlp->add(L("Dense", {{"units", 64}, {"activation", "gelu"}}));
  mlp->add(L("Dense", {{"units", 10}, {"activation", "softmax"}}));
  mlp->compile("adam", "sparse_categorical_crossentropy");
  at::Tensor x = at::randn({128, 64});
  FitArgs fa;
  fa.x = {x};
  fa.y = {x.slice(1, 0, 10).argmax(1)};
  fa.batch_size = 32;
  fa.epochs = 2;
  fa.verbose = 0;
  mlp->fit(fa);
  check_float16_weights(*mlp, {at::randn({16, 64}) * 2}, "trained MLP");

  auto cnn = models::Sequential();
  cnn->add(layers::Input({16, 16, 3}));
  cnn->add(L("Conv2D", {{"filters", 32}, {"kernel_size", 3}, {"padding", "same"}, {"activation", "relu"}}));
  auto bn = L("BatchNormalization");
  cnn->add(bn);
  cnn->add(L("MaxPooling2D", {{"pool_size", 2}}));
  cnn->add(L("Conv2D", {{"filters", 32}, {"kernel_size", 3}, {"activation", "relu"}}));
  cnn->add(L("Flatten"));
  cnn->add(L("Dense", {{"units", 10}, {"activation", "softmax"}}));
  for (auto& v : bn->weights())
    v->assign(v->name() == "moving_variance" ? at::rand(v->value().sizes()) + 0.5 : at::randn(v->value().sizes()));
  check_float16_weights(*cnn, {at::randn({4, 16, 16, 3})}, "CNN");

  auto ids = layers::Input({10}, at::kLong, "tokens");
  auto e = (*L("Embedding", {{"input_dim", 1000}, {"output_dim", 32}}))(ids);
  auto attn = (*L("MultiHeadAttention", {{"num_heads", 2}, {"key_dim", 16}}))(KerasTensors{e, e})[0];
  auto h = (*L("LayerNormalization"))((*L("Add"))(KerasTensors{e, attn}))[0];
  auto ff = (*L("Dense", {{"units", 64}, {"activation", "relu"}}))(h);
  auto pooled = (*L("GlobalAveragePooling1D"))((*L("Dense", {{"units", 32}}))(ff));
  auto lstm = (*L("LSTM", {{"units", 32}}))(h);
  auto y = (*L("Dense", {{"units", 3}, {"activation", "softmax"}}))((*L("Concatenate"))(KerasTensors{pooled, lstm}));
  auto tm = models::Functional(KerasTensors{ids}, KerasTensors{y});
  tm->compile("adam", "sparse_categorical_crossentropy");
  at::Tensor tokens = at::randint(1000, {64, 10}, at::kLong);
  fa.x = {tokens};
  fa.y = {tokens.select(1, 5).remainder(3)};
  fa.batch_size = 16;
  tm->fit(fa);
  check_float16_weights(*tm, {at::randint(1000, {8, 10}, at::kLong)}, "trained attention + LSTM model");
}

TEST(OnnxExportFloat16Weights, OutOfRangeInitializerStaysFloat32AndBadValuesAreNamed) {
  auto m = models::Sequential();
  m->add(layers::Input({3}));
  m->add(L("Dense", {{"units", 2}}));
  m->add(L("Dense", {{"units", 2}}));
  m->layers()[0]->weights()[0]->assign(at::full({3, 2}, 1e5));  // beyond float16's 65504
  OnnxExportOptions o;
  o.weights = "float16";
  kiln_onnx::ModelProto p;
  ASSERT_TRUE(p.ParseFromString(export_onnx_bytes(*m, o)));
  std::map<std::string, int> types;
  for (auto& init : p.graph().initializer()) types[init.name()] = init.data_type();
  int f32 = 0, f16 = 0;
  for (auto& [name, t] : types) {
    f32 += t == kiln_onnx::TensorProto::FLOAT;
    f16 += t == kiln_onnx::TensorProto::FLOAT16;
  }
  EXPECT_EQ(f32, 1);  // the first kernel
  EXPECT_EQ(f16, 3);
  int casts = 0;
  for (auto& n : p.graph().node()) casts += n.op_type() == "Cast";
  EXPECT_EQ(casts, 3);
  o.weights = "bfloat16";
  try {
    export_onnx_bytes(*m, o);
    ADD_FAILURE() << "weights=bfloat16 was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("Received: weights=bfloat16"), std::string::npos) << e.what();
  }
}

// --- OnnxExportOptions::optimize ----------------------------------------------

// Exports `model` plain and optimized: the optimized graph has fewer nodes
// and ONNX Runtime gives the same outputs, bit for bit.
void check_optimized(models::Model& model, const Tensors& x, const std::string& what) {
  TempDir dir;
  OnnxExportOptions o;
  export_onnx(model, dir.path() + "/plain.onnx", o);
  o.optimize = true;
  export_onnx(model, dir.path() + "/optimized.onnx", o);
  kiln_onnx::ModelProto plain, optimized;
  ASSERT_TRUE(plain.ParseFromString(read_file(dir.path() + "/plain.onnx")));
  ASSERT_TRUE(optimized.ParseFromString(read_file(dir.path() + "/optimized.onnx")));
  EXPECT_LT(optimized.graph().node_size(), plain.graph().node_size()) << what;
  for (auto& n : optimized.graph().node()) EXPECT_NE(n.op_type(), "Identity") << what << ": " << n.name();
  EXPECT_EQ(optimized.graph().output(0).name(), model.output_names()[0]) << what;
  Tensors a = onnx_runtime_outputs(dir.path() + "/plain.onnx", model, x, what);
  Tensors b = onnx_runtime_outputs(dir.path() + "/optimized.onnx", model, x, what);
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i], b[i])) << what << ": output " << i;
  std::cout << "[ measured ] " << what << ": " << plain.graph().node_size() << " nodes, "
            << optimized.graph().node_size() << " optimized; outputs equal" << std::endl;
}

TEST(OnnxExportOptimize, DropsPassThroughNodesWithTheSameOutputs) {
  SKIP_WITHOUT_ONNX_RUNTIME();
  set_random_seed(32);
  auto mlp = models::Sequential();
  mlp->add(layers::Input({12}));
  mlp->add(L("Dense", {{"units", 16}, {"activation", "relu"}}));
  mlp->add(L("Dropout", {{"rate", 0.3}}));
  mlp->add(L("GaussianNoise", {{"stddev", 0.1}}));
  mlp->add(L("Dense", {{"units", 5}, {"activation", "softmax"}}));
  check_optimized(*mlp, {at::randn({7, 12})}, "MLP with Dropout and GaussianNoise");

  auto cnn = models::Sequential();
  cnn->add(layers::Input({8, 8, 3}));
  cnn->add(L("Conv2D", {{"filters", 4}, {"kernel_size", 3}, {"activation", "relu"}}));
  cnn->add(L("Reshape", {{"target_shape", Json::array({-1, 4})}}));
  cnn->add(L("Flatten"));
  cnn->add(L("Reshape", {{"target_shape", Json::array({12, 12})}}));
  cnn->add(L("Flatten"));
  cnn->add(L("Dense", {{"units", 3}}));
  check_optimized(*cnn, {at::randn({2, 8, 8, 3})}, "CNN with Reshape and Flatten");
  kiln_onnx::ModelProto p;
  OnnxExportOptions o;
  o.optimize = true;
  ASSERT_TRUE(p.ParseFromString(export_onnx_bytes(*cnn, o)));
  int reshapes = 0;
  for (auto& n : p.graph().node()) reshapes += n.op_type() == "Reshape" || n.op_type() == "Flatten";
  EXPECT_EQ(reshapes, 1);  // the last Flatten

  // With float16 weights too.
  o.weights = "float16";
  TempDir dir;
  export_onnx(*mlp, dir.path() + "/both.onnx", o);
  at::Tensor x = at::randn({7, 12});
  EXPECT_LT(max_diff_from_onnx_runtime(dir.path() + "/both.onnx", *mlp, {x}, mlp->predict(Tensors{x}), "both"),
            kFloat16WeightsTolerance);
}

// --- Mixed precision and int8 ---------------------------------------------

// How many nodes of `op` the exported graph has; for Cast, only those to `to`.
int count_ops(models::Model& model, const std::string& op, int64_t to = -1) {
  kiln_onnx::ModelProto p;
  EXPECT_TRUE(p.ParseFromString(export_onnx_bytes(model)));
  int n = 0;
  for (auto& node : p.graph().node()) {
    if (node.op_type() != op) continue;
    bool match = to < 0;
    for (auto& a : node.attribute()) match = match || (a.name() == "to" && a.i() == to);
    n += match;
  }
  return n;
}

// Sets the global dtype policy for a scope.
struct PolicyScope {
  explicit PolicyScope(const std::string& name) { set_dtype_policy(name); }
  ~PolicyScope() { set_dtype_policy("float32"); }
};

std::shared_ptr<models::SequentialImpl> mlp(const Shape& input, const std::vector<std::string>& activations,
                                            int64_t units = 16) {
  auto m = models::Sequential();
  m->add(layers::Input(input));
  for (size_t i = 0; i < activations.size(); ++i)
    m->add(
        L("Dense",
          {{"units", i + 1 == activations.size() ? 5 : units}, {"activation", activations[i]}, {"use_bias", i != 1}}));
  // Biases start at zero: give them values, so that their rounding counts.
  for (auto& v : m->weights())
    if (v->name() == "bias") v->assign(at::randn(v->value().sizes()) * 0.5);
  return m;
}

// int8 is integer arithmetic plus a few correctly rounded float operations:
// ONNX Runtime agrees with kiln to float32 rounding (measured: at most 3e-8,
// in the softmax).
constexpr double kInt8Tolerance = 1e-5;

// The graph computes kiln's 8-bit scheme everywhere. In process, fbgemm
// without VNNI quantizes rows with negative values to 7 bits
// (docs/PRECISION.md), so kiln's side of the comparison runs the exact kernel.
class ExactInt8Kernel {
 public:
  ExactInt8Kernel() : before_(quantization::set_int8_backend("exact")) {}
  ~ExactInt8Kernel() { quantization::set_int8_backend(before_); }
  ExactInt8Kernel(const ExactInt8Kernel&) = delete;
  ExactInt8Kernel& operator=(const ExactInt8Kernel&) = delete;

 private:
  std::string before_;
};

TEST(OnnxExportInt8, DynamicMlpMatchesOnnxRuntime) {
  auto why = onnx_runtime_missing();
  if (!why.empty()) KILN_SKIP_OR_FAIL("ONNX Runtime check skipped: " << why);
  ExactInt8Kernel exact;
  set_random_seed(11);
  auto m = mlp({12}, {"relu", "gelu", "tanh", "softmax"});
  at::Tensor x = at::randn({9, 12}) * 3;
  x[0].zero_();  // a row of zeros: scale 127 / 1e-7, all products zero
  m->quantize("int8");
  EXPECT_EQ(count_ops(*m, "MatMulInteger"), 4);
  EXPECT_EQ(count_ops(*m, "MatMul"), 0);
  EXPECT_EQ(count_ops(*m, "ReduceMax"), 4);  // per-row input scales
  {
    kiln_onnx::ModelProto p;
    ASSERT_TRUE(p.ParseFromString(export_onnx_bytes(*m)));
    int int8_kernels = 0;
    for (auto& init : p.graph().initializer())
      if (init.data_type() == kiln_onnx::TensorProto::INT8) {
        ++int8_kernels;
        int64_t n = 1;
        for (auto d : init.dims()) n *= d;
        EXPECT_EQ((int64_t)init.raw_data().size(), n) << init.name();  // one byte per weight
      }
    EXPECT_EQ(int8_kernels, 4);
  }
  expect_same_as_onnx_runtime(*m, {x}, "int8 MLP (dynamic)", kInt8Tolerance);

  // Inputs of rank 3: one scale per row of the last axis.
  auto seq = mlp({3, 12}, {"relu", "linear"}, 8);
  seq->quantize("int8");
  expect_same_as_onnx_runtime(*seq, {at::randn({4, 3, 12})}, "int8 Dense on rank-3 inputs", kInt8Tolerance);
}

TEST(OnnxExportInt8, CalibratedMlpMatchesOnnxRuntime) {
  auto why = onnx_runtime_missing();
  if (!why.empty()) KILN_SKIP_OR_FAIL("ONNX Runtime check skipped: " << why);
  ExactInt8Kernel exact;
  set_random_seed(12);
  auto m = mlp({12}, {"relu", "silu", "linear"});
  at::Tensor x = at::randn({64, 12});
  m->quantize("int8");
  calibrate(*m, {x}, {.method = "minmax"});
  EXPECT_EQ(count_ops(*m, "ReduceMax"), 0);  // fixed scales
  EXPECT_EQ(count_ops(*m, "MatMulInteger"), 3);
  // 2x the calibrated range: the first layer's inputs saturate at +-127.
  expect_same_as_onnx_runtime(*m, {at::randn({10, 12}) * 2}, "int8 MLP (calibrated)", kInt8Tolerance);
}

// OnnxExportOptions::qat_as_int8: the int8 graph quantize("int8") would give.
TEST(OnnxExportInt8, QatModelExportsAsItsInt8Conversion) {
  SKIP_WITHOUT_ONNX_RUNTIME();
  ExactInt8Kernel exact;
  set_random_seed(18);
  auto m = mlp({12}, {"relu", "gelu", "softmax"});
  m->quantize("int8_qat");
  m->compile("adam", "sparse_categorical_crossentropy");
  at::Tensor x = at::randn({64, 12});
  FitArgs fa;
  fa.x = {x};
  fa.y = {x.slice(1, 0, 5).argmax(1)};
  fa.batch_size = 16;
  fa.verbose = 0;
  m->fit(fa);  // quantization-aware training moves the float kernels
  EXPECT_THROW(export_onnx_bytes(*m), ValueError);
  OnnxExportOptions o;
  o.qat_as_int8 = true;
  TempDir dir;
  export_onnx(*m, dir.path() + "/qat.onnx", o);
  m->quantize("int8");
  EXPECT_EQ(read_file(dir.path() + "/qat.onnx"), export_onnx_bytes(*m)) << "not the converted model's graph";
  at::Tensor probe = at::randn({9, 12}) * 2;
  double diff = max_diff_from_onnx_runtime(dir.path() + "/qat.onnx", *m, {probe}, m->predict(Tensors{probe}),
                                           "int8_qat MLP as int8");
  EXPECT_LT(diff, kInt8Tolerance);
  std::cout << "[ measured ] int8_qat MLP exported with qat_as_int8: max |ONNX Runtime - kiln int8| = " << diff
            << std::endl;
}

TEST(OnnxExportInt8, EmbeddingMatchesOnnxRuntime) {
  auto why = onnx_runtime_missing();
  if (!why.empty()) KILN_SKIP_OR_FAIL("ONNX Runtime check skipped: " << why);
  ExactInt8Kernel exact;
  set_random_seed(13);
  auto ids = layers::Input({4}, at::kLong, "ids");
  auto e = (*L("Embedding", {{"input_dim", 20}, {"output_dim", 6}}))(ids);
  auto f = (*L("Flatten"))(e);
  auto model = models::Functional(KerasTensors{ids}, KerasTensors{(*L("Dense", {{"units", 3}}))(f)});
  model->quantize("int8");
  EXPECT_EQ(model->layers()[1]->dtype_policy().quantization_mode(), "int8");
  EXPECT_EQ(count_ops(*model, "MatMulInteger"), 1);
  expect_same_as_onnx_runtime(*model, {at::randint(20, {5, 4}, at::kLong)}, "int8 Embedding and Dense", kInt8Tolerance);
}

// Under mixed_bfloat16 kiln rounds each layer's inputs, kernel and outputs to
// bfloat16; the graph rounds at the same places (Cast to bfloat16 and back).
// What remains are float32 differences before a rounding (erf, tanh, the
// GEMM's summation order) that tip a value to the neighbouring bfloat16,
// 2^-8 relative, carried through the later layers.
constexpr double kBfloat16Tolerance = 2e-2;

TEST(OnnxExportMixedPrecision, Bfloat16MlpMatchesOnnxRuntime) {
  auto why = onnx_runtime_missing();
  if (!why.empty()) KILN_SKIP_OR_FAIL("ONNX Runtime check skipped: " << why);
  set_random_seed(14);
  std::shared_ptr<models::SequentialImpl> m;
  {
    PolicyScope p("mixed_bfloat16");
    m = mlp({32}, {"relu", "gelu", "silu", "tanh", "softmax"}, 32);
    m->add(L("LayerNormalization"));
  }
  at::Tensor x = at::randn({32, 32}) * 2;
  ASSERT_EQ(m->predict(x).scalar_type(), at::kBFloat16);
  EXPECT_GT(count_ops(*m, "Cast", kiln_onnx::TensorProto::BFLOAT16), 0);
  double diff = expect_same_as_onnx_runtime(*m, {x}, "mixed_bfloat16 MLP", kBfloat16Tolerance);

  // The rounding matters: the same weights in float32 are further from kiln's
  // bfloat16 predictions than the exported bfloat16 graph is.
  auto f = mlp({32}, {"relu", "gelu", "silu", "tanh", "softmax"}, 32);
  f->add(L("LayerNormalization"));
  f->set_weights(m->get_weights());
  double float_diff = (f->predict(x) - m->predict(x).to(at::kFloat)).abs().max().item<double>();
  std::cout << "[ measured ] float32 graph vs kiln's mixed_bfloat16: " << float_diff << std::endl;
  EXPECT_LT(diff, float_diff);

  // Inputs of rank 3: kiln rounds the product, then adds the bias.
  std::shared_ptr<models::SequentialImpl> seq;
  {
    PolicyScope p("mixed_bfloat16");
    seq = mlp({4, 32}, {"linear", "relu", "linear"}, 32);
  }
  expect_same_as_onnx_runtime(*seq, {at::randn({8, 4, 32}) * 2}, "mixed_bfloat16 Dense on rank-3 inputs",
                              kBfloat16Tolerance);

  // int8 layers of a bfloat16 model: bfloat16 inputs and outputs around the integer product.
  m->quantize("int8");
  // Relative to the outputs' size: bfloat16 keeps 8 significant bits, so
  // one rounding step near 3 is 0.016. Measured: under 0.02 on AVX512-BF16
  // CPUs, 0.023 on an AVX2 EPYC (LibTorch's bfloat16 kernels there differ).
  const double scale = std::max(1.0, m->predict(x).to(at::kFloat).abs().max().item<double>());
  expect_same_as_onnx_runtime(*m, {x}, "int8_from_mixed_bfloat16 MLP", kBfloat16Tolerance * scale);
}

TEST(OnnxExportMixedPrecision, Bfloat16CnnMatchesOnnxRuntime) {
  auto why = onnx_runtime_missing();
  if (!why.empty()) KILN_SKIP_OR_FAIL("ONNX Runtime check skipped: " << why);
  set_random_seed(17);
  PolicyScope p("mixed_bfloat16");
  auto m = models::Sequential();
  m->add(layers::Input({11, 10, 3}));
  m->add(L("Rescaling", {{"scale", 0.37}, {"offset", 0.1}}));  // two roundings in kiln
  m->add(
      L("Conv2D", {{"filters", 6}, {"kernel_size", 3}, {"strides", 2}, {"padding", "same"}, {"activation", "relu"}}));
  auto bn = L("BatchNormalization");
  m->add(bn);
  m->add(L("Conv2D", {{"filters", 4}, {"kernel_size", Json::array({2, 3})}, {"padding", "valid"}}));
  m->add(L("MaxPooling2D", {{"pool_size", 2}, {"padding", "same"}}));
  m->add(L("Flatten"));
  m->add(L("Dense", {{"units", 32}, {"activation", "swish"}}));
  for (auto& v : bn->weights())
    v->assign(v->name() == "moving_variance" ? at::rand(v->value().sizes()) + 0.5 : at::randn(v->value().sizes()));
  for (auto& v : m->weights())
    if (v->name() == "bias") v->assign(at::randn(v->value().sizes()) * 0.5);
  expect_same_as_onnx_runtime(*m, {at::randn({32, 11, 10, 3}) * 3}, "mixed_bfloat16 CNN", kBfloat16Tolerance);
}

TEST(OnnxExportMixedPrecision, Float16LinearMlpMatchesOnnxRuntime) {
  auto why = onnx_runtime_missing();
  if (!why.empty()) KILN_SKIP_OR_FAIL("ONNX Runtime check skipped: " << why);
  set_random_seed(16);
  std::shared_ptr<models::SequentialImpl> m;
  {
    // Linear layers only: LibTorch 1.13 has no float16 relu on CPU.
    PolicyScope p("mixed_float16");
    m = mlp({32}, {"linear", "linear", "linear"}, 32);
  }
  at::Tensor x = at::randn({32, 32});
  ASSERT_EQ(m->predict(x).scalar_type(), at::kHalf);
  EXPECT_GT(count_ops(*m, "Cast", kiln_onnx::TensorProto::FLOAT16), 0);
  // float16 has 3 more mantissa bits than bfloat16.
  expect_same_as_onnx_runtime(*m, {x}, "mixed_float16 MLP", kBfloat16Tolerance / 8);
}

TEST(OnnxExportMixedPrecision, Float8AndQatAreRefusedWithTheLayerNamed) {
  for (const std::string mode : {"float8", "int8_qat"}) {
    auto m = mlp({6}, {"relu", "linear"}, 4);
    m->quantize(mode);
    const std::string layer = m->layers()[0]->name();
    try {
      export_onnx_bytes(*m);
      ADD_FAILURE() << mode << " was exported";
    } catch (const ValueError& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("layer '" + layer + "' (Dense)"), std::string::npos) << msg;
      EXPECT_NE(msg.find(mode), std::string::npos) << msg;
      EXPECT_NE(msg.find("quantize(\"int8\")"), std::string::npos) << msg;
    }
  }
}

TEST(OnnxExportCli, ExportsASavedInt8Model) {
  auto why = onnx_runtime_missing();
  if (!why.empty()) KILN_SKIP_OR_FAIL("ONNX Runtime check skipped: " << why);
  set_random_seed(15);
  TempDir dir;
  auto m = mlp({8}, {"relu", "softmax"});
  at::Tensor x = at::randn({32, 8});
  m->quantize("int8");
  calibrate(*m, {x}, {.method = "percentile", .percentile = 99.0});
  m->save(dir.path() + "/m/1");
  auto r = run_command(q(cli_path()) + " export --format onnx --model " + q(dir.path() + "/m/1") + " --output " +
                       q(dir.path() + "/model.onnx") + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ModelPtr loaded = load_model(dir.path() + "/m/1");
  at::Tensor probe = at::randn({6, 8});
  double diff = max_diff_from_onnx_runtime(dir.path() + "/model.onnx", *loaded, {probe},
                                           loaded->predict(Tensors{probe}), "kiln export of a saved int8 model");
  EXPECT_LT(diff, kInt8Tolerance);
  std::cout << "[ measured ] CLI-exported int8 model: max |ONNX Runtime - kiln| = " << diff << std::endl;

  // A float8 model: one line naming the layer, exit code 2, no file.
  auto f8 = mlp({8}, {"relu", "softmax"});
  f8->quantize("float8");
  f8->save(dir.path() + "/f8/1");
  r = run_command(q(cli_path()) + " export --format onnx --model " + q(dir.path() + "/f8/1") + " --output " +
                  q(dir.path() + "/f8.onnx") + " 2>&1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("(Dense) is quantized as float8"), std::string::npos) << r.output;
  EXPECT_FALSE(path_exists(dir.path() + "/f8.onnx"));
}

// --- string preprocessing ---------------------------------------------------------------
// A model of string input (batch,) + `shape` -> `layers`.
auto string_model(const std::vector<LayerPtr>& layers, const Shape& shape = {}) {
  auto m = models::Sequential();
  m->add(layers::Input(shape, kStringDType, "text"));
  for (auto& l : layers) m->add(l);
  return m;
}

const std::vector<std::string> kTexts = {
    "the cat sat on the mat",                             // in the vocabulary
    "",                                                   // empty
    "   the\tdog \n\n ran   ",                            // runs of whitespace, leading and trailing
    "THE Cat SAT",                                        // upper case
    "a zebra and the cat and the dog ran on and on far",  // longer than 6, OOV words
    "dog",                                                // shorter
    "cat\r\x0b\x0c"
    "dog",                                   // \r, \v and \f are whitespace too
    "\xc3\x84rger CAF\xc3\x89 caf\xc3\xa9",  // "Ärger CAFÉ café": A-Z only are lowered
};
const Json kVocabulary = Json::array({"the", "cat", "dog", "on", "sat", "ran", "mat", "and", "caf\xc3\x89"});

TEST(OnnxExportText, TextVectorizationIdsAreKilnsInOnnxRuntime) {
  SKIP_WITHOUT_ONNX_RUNTIME();
  const at::Tensor x = strings::encode(kTexts);
  for (const Json& extra :
       {Json{{"standardize", "lower"}, {"output_sequence_length", 6}},
        Json{{"standardize", "lower"}, {"output_sequence_length", 20}}, Json{{"standardize", "lower"}},
        Json{{"standardize", nullptr}, {"output_sequence_length", 4}},
        Json{{"standardize", "lower"}, {"split", nullptr}, {"vocabulary", {"dog", "the cat sat"}}},
        Json{{"standardize", "lower"}, {"output_mode", "multi_hot"}},
        Json{{"standardize", "lower"}, {"output_mode", "count"}, {"max_tokens", 12}, {"pad_to_max_tokens", true}}}) {
    Json cfg = {{"vocabulary", kVocabulary}};
    cfg.update(extra);
    auto m = string_model({L("TextVectorization", cfg)});
    const double diff = expect_same_as_onnx_runtime(*m, {x}, "TextVectorization " + extra.dump(), kLayerTolerance);
    EXPECT_EQ(diff, 0.0) << extra.dump();
  }
  // One batch whose texts are all empty: no tokens at all.
  auto m = string_model({L("TextVectorization", {{"vocabulary", kVocabulary}, {"standardize", "lower"}})});
  EXPECT_EQ(expect_same_as_onnx_runtime(*m, {strings::encode({"", " "})}, "TextVectorization, empty texts"), 0.0);
}

TEST(OnnxExportText, StringLookupIdsAreKilnsInOnnxRuntime) {
  SKIP_WITHOUT_ONNX_RUNTIME();
  const at::Tensor x = strings::encode({"cat", "", "[UNK]", "zebra", "Dog", "dog", "on", "mat"}, {2, 4});
  for (const Json& extra :
       {Json::object(), Json{{"mask_token", ""}}, Json{{"mask_token", "[MASK]"}, {"oov_token", "?"}}}) {
    Json cfg = {{"vocabulary", kVocabulary}};
    cfg.update(extra);
    auto m = string_model({L("StringLookup", cfg)}, {4});
    EXPECT_EQ(expect_same_as_onnx_runtime(*m, {x}, "StringLookup " + extra.dump()), 0.0);
  }
}

TEST(OnnxExportText, TextModelMatchesOnnxRuntime) {
  SKIP_WITHOUT_ONNX_RUNTIME();
  set_random_seed(41);
  for (const Json& length : {Json(8), Json(nullptr)}) {
    auto m =
        string_model({L("TextVectorization",
                        {{"vocabulary", kVocabulary}, {"standardize", "lower"}, {"output_sequence_length", length}}),
                      L("Embedding", {{"input_dim", 12}, {"output_dim", 6}}), L("GlobalAveragePooling1D"),
                      L("Dense", {{"units", 4}, {"activation", "softmax"}})});
    expect_same_as_onnx_runtime(*m, {strings::encode(kTexts)}, "text model, output_sequence_length=" + length.dump(),
                                kLayerTolerance);
    kiln_onnx::ModelProto p;
    ASSERT_TRUE(p.ParseFromString(export_onnx_bytes(*m)));
    EXPECT_EQ(p.opset_import(0).version(), 20);  // StringSplit's
    EXPECT_EQ(p.graph().input(0).type().tensor_type().elem_type(), kiln_onnx::TensorProto::STRING);
    EXPECT_EQ(p.graph().input(0).type().tensor_type().shape().dim_size(), 1);
    // --optimize and --weights float16 too.
    TempDir dir;
    OnnxExportOptions o;
    o.optimize = true;
    o.weights = "float16";
    export_onnx(*m, dir.path() + "/model.onnx", o);
    const Tensors x = {strings::encode(kTexts)};
    EXPECT_LT(max_diff_from_onnx_runtime(dir.path() + "/model.onnx", *m, x, m->predict(x), "optimized, float16"), 1e-3);
  }
}

TEST(OnnxExportText, SettingsWithoutAnOnnxFormAreRefusedWithWhatToDo) {
  auto refused = [](const std::string& cls, const Json& cfg, const std::string& want) {
    Json c = {{"vocabulary", kVocabulary}, {"name", "text"}};
    c.update(cfg);
    auto m = string_model({L(cls, c)});
    try {
      export_onnx_bytes(*m);
      ADD_FAILURE() << cfg.dump() << " was exported";
    } catch (const ValueError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("layer 'text' (" + cls + ")"), std::string::npos) << msg;
      EXPECT_NE(msg.find(want), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  };
  refused("TextVectorization", Json::object(),
          "standardize=\"lower_and_strip_punctuation\": ONNX has no regular-expression replace");
  refused("TextVectorization", Json::object(),
          "export it with standardize=\"lower\" (or null) and strip punctuation "
          "before the model");
  refused("TextVectorization", {{"standardize", "strip_punctuation"}}, "standardize=\"strip_punctuation\"");
  refused("TextVectorization", {{"standardize", "lower"}, {"split", "character"}},
          "split=\"character\": ONNX has no operator that splits a string into characters");
  refused("StringLookup", {{"num_oov_indices", 2}},
          "num_oov_indices=2, which spreads unknown tokens over OOV ids by FarmHash Fingerprint64");
  refused("StringLookup", {{"num_oov_indices", 0}}, "export it with num_oov_indices=1");
  refused("StringLookup", {{"output_mode", "multi_hot"}}, "exports with output_mode \"int\"");
  refused("StringLookup", {{"vocabulary", nullptr}}, "has no vocabulary");
}

}  // namespace

std::vector<std::vector<float>> train_and_export_text_classifier(const std::string& work, const std::string& onnx_path,
                                                                 const std::vector<std::string>& sentences,
                                                                 std::vector<std::string>* class_names) {
  auto kiln = [](const std::string& args) {
    auto r = run_command(q(cli_path()) + " " + args + " 2>&1");
    if (r.exit_code != 0) throw std::runtime_error("kiln " + args + ": " + r.output);
  };
  kiln("train " + q(source_path("examples/text_classifier.json")) + " --output " + q(work + "/models"));
  const std::string model = work + "/models/1";
  kiln("export --format onnx --model " + q(model) + " --output " + q(onnx_path));
  std::string lines;
  for (auto& s : sentences) lines += Json(s).dump() + "\n";  // TF Serving's row form: one string per line
  atomic_write_file(work + "/sentences.jsonl", lines);
  kiln("predict " + q(model) + " --input " + q(work + "/sentences.jsonl") + " --output " +
       q(work + "/sentence_predictions.jsonl"));
  std::vector<std::vector<float>> out;
  std::istringstream in(read_file(work + "/sentence_predictions.jsonl"));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(Json::parse(line).at("predictions").get<std::vector<float>>());
  *class_names = datasets::text_topics_class_names();
  return out;
}

}  // namespace kiln::exporter
