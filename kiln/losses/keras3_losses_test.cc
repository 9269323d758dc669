// KLDivergence, Hinge, SquaredHinge, LogCosh, Poisson, CosineSimilarity and
// BinaryFocalCrossentropy: golden values (torch.nn.functional where it has
// the op, numpy formulas elsewhere; scripts/golden/make_golden.py), Keras's
// names and defaults, config round trips and hand-checked edge cases.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "kiln/core/error.h"
#include "kiln/losses/hinge.h"
#include "kiln/losses/loss.h"
#include "kiln/losses/probabilistic.h"
#include "kiln/testing/expect_error.h"
#include "kiln/testing/golden.h"

namespace kiln {
namespace {

using namespace losses;

at::Tensor floats(std::vector<float> v) { return at::tensor(v, at::kFloat); }

TEST(Keras3LossesGolden, MatchReference) {
  Json golden = load_golden("kiln/losses/testdata/keras3_losses_golden.json");
  ASSERT_GE(golden["cases"].size(), 18u);
  std::set<std::string> classes;
  for (const auto& c : golden["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>() + " (" + c["source"].get<std::string>() + ")");
    LossPtr loss = Loss::from_json(c["loss"]);
    classes.insert(loss->class_name());
    at::Tensor y_true = golden_tensor(c["y_true"]);
    at::Tensor y_pred = golden_tensor(c["y_pred"]);
    at::Tensor per = loss->call(y_true, y_pred);
    EXPECT_EQ(per.scalar_type(), at::kFloat);
    EXPECT_TRUE(tensors_close(per, golden_tensor(c["per_sample"])));
    at::Tensor out = (*loss)(y_true, y_pred, golden_tensor(c["sample_weight"]));
    EXPECT_TRUE(tensors_close(out, golden_tensor(c["expected"])));
  }
  EXPECT_EQ(classes, (std::set<std::string>{"BinaryFocalCrossentropy", "CosineSimilarity", "Hinge", "KLDivergence",
                                            "LogCosh", "Poisson", "SquaredHinge"}));
}

TEST(Keras3Losses, RegistryNamesDefaultsAndRoundTrip) {
  const std::vector<std::pair<std::string, std::string>> names = {
      {"kl_divergence", "KLDivergence"},
      {"hinge", "Hinge"},
      {"squared_hinge", "SquaredHinge"},
      {"log_cosh", "LogCosh"},
      {"poisson", "Poisson"},
      {"cosine_similarity", "CosineSimilarity"},
      {"binary_focal_crossentropy", "BinaryFocalCrossentropy"}};
  for (const auto& [alias, cls] : names) {
    SCOPED_TRACE(alias);
    LossPtr loss = Loss::get(alias);
    EXPECT_EQ(loss->class_name(), cls);
    EXPECT_EQ(loss->name(), alias);  // Keras's default names are the function names
    EXPECT_EQ(loss->reduction(), "sum_over_batch_size");
    EXPECT_EQ(Loss::get(cls)->class_name(), cls);
    Json j = loss->to_json();
    j["config"]["reduction"] = "sum";
    j["config"]["name"] = "custom";
    LossPtr back = Loss::from_json(Json::parse(j.dump()));
    EXPECT_EQ(back->to_json(), j);
    EXPECT_THROW(Loss::from_json(Json{{"class_name", cls}, {"config", {{"bogus", 1}}}}), ValueError);
  }
  EXPECT_EQ(Loss::get("kld")->class_name(), "KLDivergence");
  EXPECT_EQ(Loss::get("logcosh")->class_name(), "LogCosh");
  Json focal = Loss::get("binary_focal_crossentropy")->get_config();
  EXPECT_EQ(focal["apply_class_balancing"], false);
  EXPECT_EQ(focal["alpha"], 0.25);
  EXPECT_EQ(focal["gamma"], 2.0);
  EXPECT_EQ(focal["from_logits"], false);
  EXPECT_EQ(focal["label_smoothing"], 0.0);
  EXPECT_EQ(focal["axis"], -1);
  EXPECT_EQ(Loss::get("cosine_similarity")->get_config()["axis"], -1);
  Json custom = BinaryFocalCrossentropy({.apply_class_balancing = true,
                                         .alpha = 0.4,
                                         .gamma = 1.0,
                                         .from_logits = true,
                                         .label_smoothing = 0.1,
                                         .reduction = "none",
                                         .name = "bfce"})
                    .to_json();
  EXPECT_EQ(Loss::from_json(custom)->to_json(), custom);
  const std::string msg = error_of<ValueError>([] { Loss::get("hingee"); });
  EXPECT_NE(msg.find("squared_hinge"), std::string::npos) << msg;
  EXPECT_NE(msg.find("binary_focal_crossentropy"), std::string::npos) << msg;
}

TEST(Keras3Losses, HandValues) {
  // Hinge with {0, 1} labels: t = (-1, 1), p = (0.5, 0.5): max(1.5, 0), max(0.5, 0) -> mean 1.0.
  EXPECT_NEAR(Hinge().call(floats({0, 1}).reshape({1, 2}), floats({0.5, 0.5}).reshape({1, 2})).item<float>(), 1.0,
              1e-6);
  EXPECT_NEAR(SquaredHinge().call(floats({0, 1}).reshape({1, 2}), floats({0.5, 0.5}).reshape({1, 2})).item<float>(),
              1.25, 1e-6);
  // KL of identical distributions is 0; Poisson at y_pred = y_true = 1 is 1 - log(1 + eps).
  at::Tensor d = floats({0.2f, 0.3f, 0.5f}).reshape({1, 3});
  EXPECT_NEAR(KLDivergence().call(d, d).item<float>(), 0.0, 1e-7);
  EXPECT_NEAR(Poisson().call(at::ones({1, 2}), at::ones({1, 2})).item<float>(), 1.0, 1e-6);
  // log(cosh(x)) ~ |x| - log 2 for large |x|, with no overflow.
  at::Tensor big = LogCosh().call(at::zeros({1, 1}), at::full({1, 1}, 200.0));
  EXPECT_TRUE(std::isfinite(big.item<float>()));
  EXPECT_NEAR(big.item<float>(), 200.0 - std::log(2.0), 1e-3);
  // Cosine: parallel -> -1, opposite -> 1, orthogonal -> 0; a zero vector gives 0, not NaN.
  at::Tensor a = floats({1, 2, 0, 0, 3, 0}).reshape({2, 3}), b = floats({2, 4, 0, 0, 0, 5}).reshape({2, 3});
  at::Tensor cs = CosineSimilarity().call(a, b);
  EXPECT_NEAR(cs[0].item<float>(), -1.0, 1e-6);
  EXPECT_NEAR(cs[1].item<float>(), 0.0, 1e-6);
  EXPECT_NEAR(CosineSimilarity().call(a, -b)[0].item<float>(), 1.0, 1e-6);
  EXPECT_EQ(CosineSimilarity().call(at::zeros({1, 3}), b.narrow(0, 0, 1)).item<float>(), 0.0f);
  // Focal: a confident correct prediction is down-weighted by (1 - p_t)^gamma.
  at::Tensor t = floats({1}).reshape({1, 1}), p = floats({0.9f}).reshape({1, 1});
  EXPECT_NEAR(BinaryFocalCrossentropy().call(t, p).item<float>(), 0.01 * -std::log(0.9), 1e-7);
  EXPECT_NEAR(BinaryFocalCrossentropy({.apply_class_balancing = true}).call(t, p).item<float>(),
              0.25 * 0.01 * -std::log(0.9), 1e-7);
}

TEST(Keras3Losses, BadConfigsAndShapes) {
  expect_error<ValueError>([] { BinaryFocalCrossentropy({.gamma = -1.0}); }, {"gamma=-1"});
  expect_error<ValueError>([] { BinaryFocalCrossentropy({.alpha = 1.5}); }, {"alpha=1.5"});
  expect_error<ValueError>([] { Hinge("avg"); }, {"reduction=avg"});
  EXPECT_THROW(Poisson().call(at::ones({2, 3}), at::ones({2, 4})), ShapeError);
  EXPECT_THROW(CosineSimilarity({.axis = 2}).call(at::ones({2, 3}), at::ones({2, 3})), ShapeError);
}

}  // namespace
}  // namespace kiln
