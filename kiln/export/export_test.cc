// ONNX export checked against ONNX Runtime (npm's onnxruntime-node, run by
// web/onnx-check/run.js): an MLP, a CNN and Functional models give kiln's
// predictions within 1e-4. Skips with a message when node is absent.
#include "kiln/export/onnx_export.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/core/json.h"
#include "kiln/core/random.h"
#include "kiln/layers/preprocessing.h"
#include "kiln/models/functional.h"
#include "kiln/models/sequential.h"
#include "kiln/testing/testing.h"
#include "kiln_onnx/onnx.pb.h"

namespace kiln::exporter {
namespace {

LayerPtr L(const std::string& cls, const Json& config = Json::object()) {
  return layer_from_json(Json{{"class_name", cls}, {"config", config}});
}

std::string q(const std::string& s) { return "'" + s + "'"; }

// Makes sure ONNX Runtime for node is there; returns "" or why it is not.
std::string onnx_runtime_missing() {
  static std::string why = [] {
    if (run_command("command -v node >/dev/null 2>&1").exit_code != 0)
      return std::string("node is not installed (Debian: apt-get install nodejs npm)");
    const std::string dir = source_path("web/onnx-check");
    if (path_exists(dir + "/node_modules/onnxruntime-node/package.json")) return std::string();
    auto r = run_command("cd " + q(dir) + " && npm ci --ignore-scripts --no-audit --no-fund 2>&1");
    if (r.exit_code != 0) return "`npm ci --ignore-scripts` in web/onnx-check failed: " + r.output.substr(0, 300);
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

// Exports `model`, runs it in ONNX Runtime on `x` and compares with kiln.
void expect_same_as_onnx_runtime(Model& model, const Tensors& x, const std::string& what) {
  TempDir dir;
  export_onnx(model, dir.path() + "/model.onnx");
  Json inputs;
  auto names = model.input_names();
  for (size_t i = 0; i < x.size(); ++i) inputs[names[i]] = tensor_json(x[i]);
  atomic_write_file(dir.path() + "/inputs.json", inputs.dump());
  auto r = run_command("node " + q(source_path("web/onnx-check/run.js")) + " " + q(dir.path() + "/model.onnx") + " " +
                       q(dir.path() + "/inputs.json") + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << what << ": " << r.output;
  Json got = Json::parse(r.output);
  Tensors want = model.predict(x);
  auto out_names = model.output_names();
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(got.contains(out_names[i]))
        << what << ": no output " << out_names[i] << " in " << r.output.substr(0, 200);
    auto& o = got[out_names[i]];
    auto shape = o["shape"].get<std::vector<int64_t>>();
    ASSERT_EQ(at::IntArrayRef(shape), want[i].sizes()) << what;
    auto data = o["data"].get<std::vector<float>>();
    auto ort = at::tensor(data).reshape(shape);
    double diff = (ort - want[i].to(at::kFloat)).abs().max().item<double>();
    EXPECT_LT(diff, 1e-4) << what << ", output " << out_names[i];
  }
}

TEST(OnnxExport, MlpMatchesOnnxRuntime) {
  auto why = onnx_runtime_missing();
  if (!why.empty()) GTEST_SKIP() << "ONNX Runtime check skipped: " << why;
  set_random_seed(1);
  auto m = std::make_shared<Sequential>();
  m->add(Input({12}));
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
  if (!why.empty()) GTEST_SKIP() << "ONNX Runtime check skipped: " << why;
  set_random_seed(2);
  auto m = std::make_shared<Sequential>();
  m->add(Input({11, 10, 3}));
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

  auto g = std::make_shared<Sequential>();
  g->add(Input({8, 8, 2}));
  g->add(L("Conv2D", {{"filters", 3}, {"kernel_size", 3}, {"padding", "same"}}));
  g->add(L("AveragePooling2D", {{"pool_size", 3}, {"strides", 2}, {"padding", "same"}}));
  g->add(L("GlobalAveragePooling2D"));
  expect_same_as_onnx_runtime(*g, {at::randn({2, 8, 8, 2})}, "CNN with same-padded average pooling");
}

TEST(OnnxExport, FunctionalWithAddAndConcatenateMatchesOnnxRuntime) {
  auto why = onnx_runtime_missing();
  if (!why.empty()) GTEST_SKIP() << "ONNX Runtime check skipped: " << why;
  set_random_seed(3);
  auto a = Input({6}, at::kFloat, "a");
  auto b = Input({6}, at::kFloat, "b");
  auto norm = std::make_shared<Normalization>();
  auto na = (*norm)(a);
  auto h1 = (*L("Dense", {{"units", 8}, {"activation", "relu"}}))(na);
  auto h2 = (*L("Dense", {{"units", 8}}))(b);
  auto sum = (*L("Add"))(KerasTensors{h1, h2});
  auto cat = (*L("Concatenate"))(KerasTensors{sum[0], na, b});
  auto shared = L("Dense", {{"units", 4}, {"activation", "tanh"}});
  auto y1 = (*shared)(cat);
  auto y2 = (*L("Dense", {{"units", 2}}))(sum);
  auto model = std::make_shared<Functional>(KerasTensors{a, b}, KerasTensors{y1[0], y2[0]});
  norm->adapt(at::randn({50, 6}) * 3 + 1);
  expect_same_as_onnx_runtime(*model, {at::randn({5, 6}), at::randn({5, 6})}, "Functional");

  auto ids = Input({4}, at::kLong, "ids");
  auto e = (*L("Embedding", {{"input_dim", 10}, {"output_dim", 3}}))(ids);
  auto f = (*L("Flatten"))(e);
  auto emb = std::make_shared<Functional>(KerasTensors{ids}, KerasTensors{(*L("Dense", {{"units", 2}}))(f)});
  expect_same_as_onnx_runtime(*emb, {at::randint(10, {3, 4}, at::kLong)}, "Embedding");
}

TEST(OnnxExport, GraphIsWellFormed) {
  auto m = std::make_shared<Sequential>();
  m->add(Input({3}));
  m->add(L("Dense", {{"units", 2}}));
  kiln_onnx::ModelProto p;
  ASSERT_TRUE(p.ParseFromString(export_onnx_bytes(*m)));
  EXPECT_EQ(p.opset_import(0).version(), 17);
  EXPECT_EQ(p.graph().input(0).name(), m->input_names()[0]);
  EXPECT_EQ(p.graph().output(0).name(), m->output_names()[0]);
  EXPECT_EQ(p.graph().input(0).type().tensor_type().shape().dim(0).dim_param(), "batch");
  EXPECT_EQ(p.graph().initializer_size(), 2);  // kernel, bias
}

TEST(OnnxExport, UnsupportedLayerIsNamed) {
  auto m = std::make_shared<Sequential>();
  m->add(Input({5, 3}));
  m->add(L("MaxPooling1D", {{"pool_size", 2}}));
  m->add(L("Flatten"));
  try {
    export_onnx_bytes(*m);
    FAIL() << "MaxPooling1D was exported";
  } catch (const ValueError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("(MaxPooling1D) has no ONNX export"), std::string::npos) << msg;
    EXPECT_NE(msg.find("layer '" + m->layers()[0]->name() + "'"), std::string::npos) << msg;
  }
  OnnxExportOptions o;
  o.opset = 9;
  EXPECT_THROW(export_onnx_bytes(*m, o), ValueError);
}

TEST(OnnxExportCli, ExportsASavedModel) {
  TempDir dir;
  auto m = std::make_shared<Sequential>();
  m->add(Input({4}));
  m->add(L("Dense", {{"units", 3}, {"activation", "softmax"}}));
  m->save(dir.path() + "/m/1");
  auto r = run_command(q(cli_path()) + " export --format onnx --model " + q(dir.path() + "/m/1") + " --output " +
                       q(dir.path() + "/model.onnx") + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  kiln_onnx::ModelProto p;
  ASSERT_TRUE(p.ParseFromString(read_file(dir.path() + "/model.onnx")));
  EXPECT_EQ(p.producer_name(), "kiln");
  r = run_command(q(cli_path()) + " export --format tflite --model " + q(dir.path() + "/m/1") + " --output x 2>&1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

}  // namespace
}  // namespace kiln::exporter
