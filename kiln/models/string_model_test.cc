// Models with string inputs (kiln/core/string_tensor.h): Functional and
// Sequential built on Input(shape, kStringDType), trained, evaluated and
// predicted from raw sentences, saved and loaded with the vocabulary.
#include <gtest/gtest.h>

#include "kiln/core/dtype.h"
#include "kiln/core/random.h"
#include "kiln/core/string_tensor.h"
#include "kiln/data/datasets.h"
#include "kiln/layers/dense.h"
#include "kiln/layers/embedding.h"
#include "kiln/layers/pooling.h"
#include "kiln/layers/text_preprocessing.h"
#include "kiln/models/functional.h"
#include "kiln/models/sequential.h"
#include "kiln/testing/expect_error.h"
#include "kiln/testing/testing.h"

namespace kiln {
namespace {

Json vectorize_config(int64_t max_tokens, int64_t length) {
  return Json{{"max_tokens", max_tokens}, {"output_sequence_length", length}};
}

TEST(StringModels, FunctionalAndSequentialTakeStringInputs) {
  auto tv = layers::TextVectorization(Json{{"vocabulary", {"the", "cat", "dog"}}, {"output_sequence_length", 4}});
  KerasTensor in = layers::Input({}, kStringDType, "text");
  EXPECT_EQ(in.dtype, kStringDType);
  KerasTensor ids = tv(in);
  EXPECT_EQ(ids.dtype, at::kLong);
  EXPECT_EQ(ids.shape, (Shape{kNone, 4}));
  KerasTensor h = layers::GlobalAveragePooling1D()(layers::Embedding({.input_dim = 5, .output_dim = 3})(ids));
  auto model = models::Functional(KerasTensors{in}, KerasTensors{layers::Dense(2, "softmax")(h)});
  EXPECT_EQ(model->input_dtypes(), (std::vector<at::ScalarType>{kStringDType}));
  EXPECT_NE(model->summary_string().find("(None,) string"), std::string::npos) << model->summary_string();
  // Any row width: the logical shape is what the input checks.
  EXPECT_EQ(sizes_of((*model)(strings::encode({"the cat", "a much longer sentence about a dog"}))), (Shape{2, 2}));
  expect_error<ValueError>([&] { (*model)(at::zeros({2, 8})); }, {"input 'text'", "strings", "float32"});
  expect_error<ShapeError>([&] { (*model)(strings::encode({"a", "b"}, {1, 2})); }, {"input 'text'", "(None,)"});
  // The config round trip keeps the string input.
  auto copy = std::dynamic_pointer_cast<models::Model>(layer_from_json(model->to_json()));
  ASSERT_TRUE(copy);
  EXPECT_EQ(copy->input_dtypes(), (std::vector<at::ScalarType>{kStringDType}));

  auto seq = models::Sequential({layers::Input({}, kStringDType),
                                 layers::TextVectorization(Json{{"vocabulary", {"a", "b"}}, {"output_mode", "count"}}),
                                 layers::Dense(2)});
  EXPECT_EQ(seq->input_dtypes(), (std::vector<at::ScalarType>{kStringDType}));
  EXPECT_NE(seq->summary_string().find("Input: (None,) string"), std::string::npos) << seq->summary_string();
  EXPECT_EQ(sizes_of((*seq)(strings::encode({"a b b", "c"}))), (Shape{2, 2}));
  auto seq_copy = std::dynamic_pointer_cast<models::Model>(layer_from_json(seq->to_json()));
  EXPECT_EQ(seq_copy->input_dtypes(), (std::vector<at::ScalarType>{kStringDType}));
  // Without a string Input, the model would be built on the bytes: the error says what to add.
  auto no_input = models::Sequential({layers::TextVectorization(Json{{"vocabulary", {"a"}}}), layers::Dense(2)});
  expect_error<ShapeError>([&] { (*no_input)(strings::encode({"a", "b"})); }, {"TextVectorization", "kStringDType"});
}

// A model whose output is strings (StringLookup(invert=true)) predicts in
// batches whose rows have different widths: predict() pads them to one.
TEST(StringModels, PredictJoinsStringOutputsOfDifferentWidths) {
  auto words = layers::StringLookup(Json{{"vocabulary", {"a", "longer_word"}}, {"invert", true}});
  auto model = models::Sequential({layers::Input({}, at::kLong), words});
  at::Tensor out = model->predict(at::tensor({1, 1, 2, 1}, at::kLong), {.batch_size = 2});
  EXPECT_EQ(strings::decode(out), (std::vector<std::string>{"a", "a", "longer_word", "a"}));
}

// The string layers compute int64 ids / float32 encodings whatever the
// policy: mixed precision casts neither their inputs nor their outputs.
TEST(StringModels, MixedPrecisionLeavesStringLayersAlone) {
  set_dtype_policy("mixed_bfloat16");
  auto tv = layers::TextVectorization(Json{{"vocabulary", {"a", "b"}}, {"output_mode", "multi_hot"}});
  auto model = models::Sequential({layers::Input({}, kStringDType), tv, layers::Dense(2)});
  at::Tensor counts = tv(strings::encode({"a b", "b"}));
  at::Tensor out = (*model)(strings::encode({"a b", "b"}));
  set_dtype_policy("float32");
  EXPECT_EQ(counts.scalar_type(), at::kFloat);
  EXPECT_EQ(out.scalar_type(), at::kBFloat16);
}

// A text classifier trained from raw sentences (datasets::text_topics):
// well above chance (0.25); saved and loaded, it gives identical ids and
// predictions on raw strings.
TEST(StringModels, TextClassifierTrainsFromRawStringsAndSavesItsVocabulary) {
  set_random_seed(5);
  auto data = datasets::text_topics(1200, 400, 11);
  auto tv = layers::TextVectorization(vectorize_config(1000, 12));
  tv->adapt(strings::encode(data.x_train));
  auto model =
      models::Sequential({layers::Input({}, kStringDType), tv, layers::Embedding({.input_dim = 1000, .output_dim = 16}),
                          layers::GlobalAveragePooling1D(), layers::Dense(4, "softmax")});
  model->compile("adam", "sparse_categorical_crossentropy", {"accuracy"});
  FitArgs fit;
  fit.x = {strings::encode(data.x_train)};
  fit.y = {data.y_train};
  fit.epochs = 6;
  fit.batch_size = 32;
  fit.verbose = 0;
  model->fit(fit);
  EvaluateArgs ev;
  ev.x = {strings::encode(data.x_test)};
  ev.y = {data.y_test};
  const double accuracy = model->evaluate(ev).at("accuracy");
  EXPECT_GT(accuracy, 0.7);  // chance 0.25
  std::cout << "[ INFO     ] text_topics held-out accuracy: " << accuracy << "\n";

  TempDir dir;
  model->save(dir.path() + "/m");
  ModelPtr loaded = load_model(dir.path() + "/m");
  EXPECT_EQ(loaded->input_dtypes(), (std::vector<at::ScalarType>{kStringDType}));
  auto loaded_tv = std::dynamic_pointer_cast<layers::TextVectorizationImpl>(loaded->get_layer(tv->name()));
  ASSERT_TRUE(loaded_tv);
  EXPECT_EQ(loaded_tv->get_vocabulary(), tv->get_vocabulary());
  const std::vector<std::string> sentences = {"The striker scored a late GOAL!", "Bake the bread, then add garlic.", "",
                                              "A new laptop and a hot oven"};
  at::Tensor raw = strings::encode(sentences);
  EXPECT_TRUE(at::equal((*loaded_tv)(raw), tv(raw)));
  EXPECT_TRUE(at::equal(loaded->predict(raw), model->predict(raw)));
}

}  // namespace
}  // namespace kiln
