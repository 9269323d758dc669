// The data section's `skip` key (docs/SPEC.md, "data"): it drops leading
// training rows before `limit`, so `"skip": N` names exactly the rows that
// `"limit": N` leaves out (an ensemble's validation rows after a search).
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "kiln/core/error.h"
#include "kiln/core/json.h"
#include "kiln/core/string_tensor.h"
#include "kiln/layers/text_preprocessing.h"
#include "kiln/spec/spec.h"
#include "kiln/testing/testing.h"

namespace kiln::spec {
namespace {

class SpecDataSkip : public ::testing::Test {
 protected:
  void SetUp() override {
    // Ten rows: feature f = 10 * row, label = row.
    std::ofstream out(csv_);
    out << "f,e,label\n";
    for (int i = 0; i < 10; ++i) out << 10 * i << "," << -i << "," << i << "\n";
  }
  Json data(Json extra) const {
    Json d = {{"source", "csv"}, {"path", csv_}, {"label", "label"}};
    for (auto& [k, v] : extra.items()) d[k] = v;
    return d;
  }
  static std::vector<int64_t> labels(const at::Tensor& y) {
    auto c = y.contiguous().to(at::kLong);
    return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
  }
  TempDir dir_;
  std::string csv_ = dir_.path() + "/rows.csv";
};

TEST_F(SpecDataSkip, SkipNamesTheRowsLimitLeavesOut) {
  auto head = load_data(data({{"limit", 7}}));
  auto tail = load_data(data({{"skip", 7}}));
  EXPECT_EQ(labels(head.y_train), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(labels(tail.y_train), (std::vector<int64_t>{7, 8, 9}));
  EXPECT_EQ(tail.x_train.size(0), 3);
  EXPECT_FLOAT_EQ(tail.x_train[0][0].item<float>(), 70.0f);  // features move with their labels
}

TEST_F(SpecDataSkip, SkipComesBeforeLimit) {
  auto d = load_data(data({{"skip", 2}, {"limit", 3}}));
  EXPECT_EQ(labels(d.y_train), (std::vector<int64_t>{2, 3, 4}));
}

TEST_F(SpecDataSkip, NamedInputsAndOutputsAreSkippedAlike) {
  Json d = {{"source", "csv"},
            {"path", csv_},
            {"inputs", {{"f", "f"}, {"e", "e"}}},
            {"outputs", {{"label", "label"}}},
            {"skip", 8}};
  auto s = load_data(d);
  ASSERT_EQ(s.xs_train.size(), 2u);
  EXPECT_EQ(s.xs_train[0].size(0), 2);
  EXPECT_EQ(s.xs_train[1].size(0), 2);
  EXPECT_FLOAT_EQ(s.xs_train[1][0][0].item<float>(), -8.0f);
  EXPECT_EQ(labels(s.ys_train[0]), (std::vector<int64_t>{8, 9}));
}

TEST_F(SpecDataSkip, BadSkipsAreOneClearError) {
  try {
    load_data(data({{"skip", 10}}));
    FAIL() << "skipping every row must be refused";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("`data.skip`=10 leaves no training rows of 10"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(load_data(data({{"skip", -1}})), ValueError);
  EXPECT_THROW(load_data(data({{"skip", "3"}})), ValueError);
}

}  // namespace
}  // namespace kiln::spec

namespace kiln::spec {
namespace {

// The spec's compile section takes Keras's jit_compile (CUDA-graph capture
// of the train step on a GPU, kiln/training/step_graph.h).
TEST(SpecCompile, JitCompileIsAKnownKey) {
  EXPECT_TRUE(compile_args_from_spec(Json{{"jit_compile", true}}).jit_compile);
  EXPECT_FALSE(compile_args_from_spec(Json{{"jit_compile", "auto"}}).jit_compile);
  EXPECT_FALSE(compile_args_from_spec(Json::object()).jit_compile);
  EXPECT_THROW(compile_args_from_spec(Json{{"jit_compile", 3}}), ValueError);
}

// `"source": "text_topics"`: raw sentences as a string tensor, kept as
// strings (no dtype cast); `model.adapt` fits a TextVectorization on them.
TEST(SpecTextData, TextTopicsStayStringsAndAdaptTheModel) {
  DataSplits d = load_data(Json{{"source", "text_topics"}, {"train_size", 300}, {"test_size", 50}, {"seed", 3}});
  EXPECT_TRUE(d.text);
  EXPECT_EQ(d.x_train.scalar_type(), string_storage_dtype);
  EXPECT_EQ(strings::logical_shape(d.x_train), (Shape{300}));
  EXPECT_EQ(strings::logical_shape(d.x_test), (Shape{50}));
  EXPECT_EQ(d.y_train.scalar_type(), at::kLong);
  DataSplits limited = load_data(Json{{"source", "text_topics"}, {"train_size", 300}, {"limit", 20}});
  EXPECT_EQ(strings::logical_shape(limited.x_train), (Shape{20}));
  EXPECT_THROW(load_data(Json{{"source", "text_topics"}, {"scale", 2}}), ValueError);
  EXPECT_THROW(load_data(Json{{"source", "text_topics"}, {"dtype", "float32"}}), ValueError);
  EXPECT_THROW(load_data(Json{{"source", "text_topics"}, {"train_size", 0}}), ValueError);

  const Json model_section = {
      {"layers",
       {{{"class_name", "TextVectorization"}, {"config", {{"name", "vec"}, {"output_mode", "multi_hot"}}}},
        {{"class_name", "Dense"}, {"config", {{"name", "out"}, {"units", 4}, {"activation", "softmax"}}}}}},
      {"input_shape", Json::array()},
      {"input_dtype", "string"},
      {"adapt", {"vec"}}};
  ModelPtr model = build_model(model_section, std::nullopt);
  EXPECT_EQ(model->input_dtypes(), (std::vector<at::ScalarType>{kStringDType}));
  model = adapt_model(model_section, model, d.x_train);
  // Rebuilt on the adapted vocabulary: the multi_hot depth follows it.
  auto vec = std::dynamic_pointer_cast<layers::TextVectorizationImpl>(model->get_layer("vec"));
  ASSERT_TRUE(vec);
  EXPECT_GT(vec->vocabulary_size(), 20);
  EXPECT_EQ(model->get_layer("out")->weights()[0]->value().size(0), vec->vocabulary_size());
  EXPECT_EQ(sizes_of(model->predict(d.x_test)), (Shape{50, 4}));
  Json bad = model_section;
  bad["adapt"] = {"out"};
  EXPECT_THROW(adapt_model(bad, build_model(bad, std::nullopt), d.x_train), ValueError);
}

}  // namespace
}  // namespace kiln::spec
