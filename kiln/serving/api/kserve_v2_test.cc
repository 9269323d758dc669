#include "kiln/serving/api/kserve_v2.h"

#include <gtest/gtest.h>

#include "kiln/testing/expect_error.h"

namespace kiln::serving {
namespace {

TEST(KServeV2, ModelSpecTakesADecimalVersion) {
  EXPECT_FALSE(kserve_v2::model_spec("m", "").version.has_value());
  EXPECT_EQ(kserve_v2::model_spec("m", "12").version, 12);
  expect_error<ServingError>([] { kserve_v2::model_spec("", "1"); }, {"the model name is empty"});
  expect_error<ServingError>([] { kserve_v2::model_spec("m", "x"); }, {"model version 'x' is not a positive integer"});
  expect_error<ServingError>([] { kserve_v2::model_spec("m", "0"); }, {"is not a positive integer"});
}

TEST(KServeV2, InputsAreCheckedAgainstTheDefaultSignature) {
  const Json sigs = Json::parse(R"({"serving_default": {"inputs": {"x": {"dtype": "float32", "shape": [null, 2]}},
                                                         "outputs": {"y": {"dtype": "float32", "shape": [null]}}}})");
  kserve_v2::check_input(sigs, "x", at::kFloat);
  expect_error<ServingError>([&] { kserve_v2::check_input(sigs, "z", at::kFloat); }, {"unknown input \"z\""});
  expect_error<ServingError>([&] { kserve_v2::check_input(sigs, "x", at::kDouble); },
                             {"input \"x\" has datatype FP64; the model expects FP32"});
  expect_error<ServingError>([&] { kserve_v2::check_input(Json::object(), "x", at::kFloat); },
                             {"'serving_default' not found"});
}

TEST(KServeV2, OutputNamesAreInRequestOrderEachOnce) {
  TensorMap out{{"a", at::zeros({1})}, {"b", at::zeros({1})}};
  EXPECT_EQ(kserve_v2::output_names(out, {}), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(kserve_v2::output_names(out, {"b", "a", "b"}), (std::vector<std::string>{"b", "a"}));
  expect_error<ServingError>([&] { kserve_v2::output_names(out, {"c"}); },
                             {"unknown output \"c\"; the model outputs \"a\", \"b\""});
}

TEST(KServeV2, ModelMetadataJson) {
  kserve_v2::ModelMetadata m;
  m.name = "m";
  m.versions = {"2", "1"};
  m.inputs = {{"x", "FP32", {-1, 4}}};
  EXPECT_EQ(kserve_v2::to_json(m).dump(),
            R"({"name":"m","versions":["2","1"],"platform":"kiln","inputs":[{"name":"x","datatype":"FP32",)"
            R"("shape":[-1,4]}],"outputs":[]})");
}

}  // namespace
}  // namespace kiln::serving
