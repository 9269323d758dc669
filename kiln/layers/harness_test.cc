// Tests of the conformance harness itself: it must fail, in the right check,
// for layers that are broken in the ways it claims to catch. (Passing every
// real layer proves nothing if it cannot fail.)
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include "kiln/core/io.h"
#include "kiln/layers/config_reader.h"
#include "kiln/layers/dense.h"
#include "kiln/testing/layer_conformance.h"
#include "kiln/testing/testing.h"

namespace kiln {
namespace {

// A per-feature scale y = x * w, broken according to `mode`.
class TestOnlyScale : public SimpleLayer {
 public:
  explicit TestOnlyScale(const Json& config) : SimpleLayer(config) {
    ConfigReader r(config, "TestOnlyScale");
    mode_ = r.string("mode", "ok");
    r.finish();
  }
  std::string class_name() const override { return "TestOnlyScale"; }
  void build(const std::vector<Shape>& s) override {
    w_ = add_weight("w", {s[0].back()}, Initializer::get("random_normal"));
    if (mode_ == "hidden_state") hidden_ = at::randn({s[0].back()});
  }
  at::Tensor call1(const at::Tensor& x, bool training) override {
    at::Tensor w = value(w_);
    if (mode_ == "wrong_input_grad") return x * w + (x.detach() - x) * 0.5;  // d/dx off by 0.5
    if (mode_ == "flipped_weight_grad") return x * (2 * w.detach() - w);     // d/dw = -x
    if (mode_ == "ignores_policy") return x.to(at::kFloat) * w.to(at::kFloat);
    if (mode_ == "hidden_state") return x * w + compute_cast(hidden_);  // state outside the weights
    return x * w;
  }
  Json get_config() const override {
    Json j = base_config();
    if (mode_ != "forgets_config") j["mode"] = mode_;
    return j;
  }

 private:
  std::string mode_;
  VariablePtr w_;
  at::Tensor hidden_;
};
KILN_REGISTER_LAYER(TestOnlyScale);

LayerTestCase scale_case(const std::string& mode) {
  LayerTestCase c;
  c.name = "TestOnlyScale_" + mode;
  c.make = from_config("TestOnlyScale", {{"mode", mode}});
  c.input_shapes = {{3, 4}};
  c.expected_output_shapes = {{3, 4}};
  c.expected_trainable_params = 4;
  return c;
}

// Runs the harness with failures intercepted; returns their messages.
std::vector<std::string> failures_of(const LayerTestCase& c) {
  ::testing::TestPartResultArray results;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
    run_layer_test(c);
  }
  std::vector<std::string> out;
  for (int i = 0; i < results.size(); ++i)
    if (results.GetTestPartResult(i).failed()) out.push_back(results.GetTestPartResult(i).message());
  return out;
}

bool any_mentions(const std::vector<std::string>& msgs, const std::string& text) {
  for (auto& m : msgs)
    if (m.find(text) != std::string::npos) return true;
  return false;
}

std::string joined(const std::vector<std::string>& msgs) {
  std::string s;
  for (auto& m : msgs) s += m.substr(0, 400) + "\n---\n";
  return s;
}

TEST(Harness, PassesACorrectLayer) {
  auto f = failures_of(scale_case("ok"));
  EXPECT_TRUE(f.empty()) << joined(f);
}

TEST(Harness, CatchesAWrongInputGradient) {
  auto f = failures_of(scale_case("wrong_input_grad"));
  EXPECT_TRUE(any_mentions(f, "d/d input 0")) << joined(f);
}

TEST(Harness, CatchesAWrongWeightGradientAndAFailedTrainingStep) {
  auto f = failures_of(scale_case("flipped_weight_grad"));
  EXPECT_TRUE(any_mentions(f, "d/d test_only_scale")) << joined(f);
  EXPECT_TRUE(any_mentions(f, "check: one SGD step lowers the loss")) << joined(f);
}

TEST(Harness, CatchesAConfigThatDoesNotRoundTrip) {
  auto f = failures_of(scale_case("forgets_config"));
  EXPECT_TRUE(any_mentions(f, "check: config round trip")) << joined(f);
}

TEST(Harness, CatchesALayerThatIgnoresItsDTypePolicy) {
  auto f = failures_of(scale_case("ignores_policy"));
  EXPECT_TRUE(any_mentions(f, "check: mixed_bfloat16")) << joined(f);
}

TEST(Harness, CatchesStateThatDoesNotSaveWithTheWeights) {
  auto f = failures_of(scale_case("hidden_state"));
  EXPECT_TRUE(any_mentions(f, "check: save/load round trip")) << joined(f);
}

TEST(Harness, CatchesWrongShapesAndParameterCounts) {
  LayerTestCase c;
  c.name = "Dense_wrong_expectations";
  c.make = from_config("Dense", {{"units", 3}});
  c.input_shapes = {{2, 4}};
  c.expected_output_shapes = {{2, 4}};
  c.expected_trainable_params = 12;
  auto f = failures_of(c);
  EXPECT_TRUE(any_mentions(f, "check: output shapes")) << joined(f);
  EXPECT_TRUE(any_mentions(f, "trainable params")) << joined(f);
}

TEST(Harness, WeightsFileRoundTripsAndRejectsBadFiles) {
  TempDir dir;
  auto a = layers::Dense(3);
  (*a)(at::randn({2, 4}));
  const std::string path = join_path(dir.path(), "w.bin");
  save_layer_weights(*a, path);
  auto b = layers::Dense(3, "linear", Json{{"name", a->name()}});
  (*b)(at::randn({2, 4}));
  load_layer_weights(*b, path);
  EXPECT_TRUE(at::equal(a->kernel()->value(), b->kernel()->value()));

  auto other = layers::Dense(3, "linear", Json{{"name", "another_name"}});
  (*other)(at::randn({2, 4}));
  EXPECT_THROW(load_layer_weights(*other, path), NotFoundError);  // keyed by path
  auto wider = layers::Dense(5, "linear", Json{{"name", a->name()}});
  (*wider)(at::randn({2, 4}));
  EXPECT_THROW(load_layer_weights(*wider, path), ShapeError);
  atomic_write_file(path, read_file(path).substr(0, 30));
  EXPECT_THROW(load_layer_weights(*b, path), FormatError);
  atomic_write_file(path, "not a weights file");
  EXPECT_THROW(load_layer_weights(*b, path), FormatError);
}

}  // namespace
}  // namespace kiln
