#include "kiln/serving/api/tfs_v1.h"

#include <gtest/gtest.h>

#include "kiln/testing/expect_error.h"

namespace kiln::serving {
namespace {

const Json kTfsSignatures = Json::parse(R"({
  "serving_default": {"method_name": "predict",
                      "inputs": {"x": {"dtype": "float32", "shape": [null, 4]}},
                      "outputs": {"y": {"dtype": "int64", "shape": [null]}}},
  "rank": {"method_name": "tensorflow/serving/regress",
           "inputs": {"x": {"dtype": "uint8", "shape": [null, 2]}},
           "outputs": {"outputs": {"shape": [null]}}}
})");

// The SignatureDefMap both front ends answer GetModelMetadata with: the REST
// body is these fields as TF Serving's JSON, the gRPC answer the same as protos.
TEST(TfsV1, SignatureDefsComeFromTheSignatureJson) {
  auto defs = tfs_v1::signature_defs(kTfsSignatures);
  ASSERT_EQ(defs.size(), 2u);
  EXPECT_EQ(defs[0].first, "serving_default");  // the signature JSON's order
  EXPECT_EQ(defs[0].second.method_name, "tensorflow/serving/predict");
  ASSERT_EQ(defs[0].second.inputs.size(), 1u);
  EXPECT_EQ(defs[0].second.inputs[0].first, "x");
  EXPECT_EQ(defs[0].second.inputs[0].second.name, "x:0");
  EXPECT_EQ(defs[0].second.inputs[0].second.dtype, "DT_FLOAT");
  EXPECT_EQ(defs[0].second.inputs[0].second.shape, (Shape{-1, 4}));
  EXPECT_EQ(defs[0].second.outputs[0].second.dtype, "DT_INT64");
  EXPECT_EQ(defs[1].first, "rank");
  EXPECT_EQ(defs[1].second.method_name, "tensorflow/serving/regress");  // full names stay as they are
  EXPECT_EQ(defs[1].second.outputs[0].second.dtype, "DT_FLOAT");        // float32 when the JSON names none
  EXPECT_EQ(tfs_v1::tf_dtype_name("complex64"), "DT_INVALID");
}

TEST(TfsV1, StatusJsonIsTfServings) {
  std::vector<VersionStatus> versions = {{2, VersionState::kError, "bad weights"}, {1, VersionState::kReady, ""}};
  EXPECT_EQ(tfs_v1::status_json(versions).dump(),
            R"({"model_version_status":[{"version":"2","state":"END","status":{"error_code":"UNKNOWN",)"
            R"("error_message":"bad weights"}},{"version":"1","state":"AVAILABLE","status":{"error_code":"OK",)"
            R"("error_message":""}}]})");
}

TEST(TfsV1, PredictOutputNamesFollowTheFilter) {
  TensorMap out{{"a", at::zeros({1})}, {"b", at::zeros({1})}};
  EXPECT_EQ(tfs_v1::predict_output_names(out, std::vector<std::string>{}), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(tfs_v1::predict_output_names(out, std::vector<std::string>{"b"}), (std::vector<std::string>{"b"}));
  expect_error<ServingError>([&] { tfs_v1::predict_output_names(out, std::vector<std::string>{"c"}); },
                             {"output tensor alias not found in signature: c"});
}

TEST(TfsV1, MultiInferenceRulesAreTfServings) {
  using Task = tfs_v1::MultiInferenceTask;
  const std::string classify = "tensorflow/serving/classify", regress = "tensorflow/serving/regress";
  std::vector<Task> tasks = {{{"m"}, "", classify}, {{"m"}, "rank", regress}};
  EXPECT_EQ(tfs_v1::check_multi_inference(tasks).name, "m");
  expect_error<ServingError>([] { tfs_v1::check_multi_inference({}); }, {"at least one task"});
  expect_error<ServingError>(
      [&] {
        tfs_v1::check_multi_inference({tasks[0], {{"other"}, "rank", regress}});
      },
      {"must name the same model and version", "'other' differs from 'm'"});
  expect_error<ServingError>(
      [&] {
        tfs_v1::check_multi_inference({tasks[0], {{"m"}, "rank", "predict"}});
      },
      {"Unsupported signature method_name: 'predict'"});
  expect_error<ServingError>(
      [&] {
        tfs_v1::check_multi_inference({tasks[0], {{"m"}, "serving_default", regress}});
      },
      {"Duplicate evaluation of signature: serving_default"});
}

TEST(TfsV1, MetadataFieldsMustBeSignatureDef) {
  tfs_v1::check_metadata_fields({"signature_def"});
  expect_error<ServingError>([] { tfs_v1::check_metadata_fields({}); }, {"at least one metadata_field"});
  expect_error<ServingError>(
      [] {
        tfs_v1::check_metadata_fields({"signature_def", "x"});
      },
      {"Metadata field x is not supported"});
}

}  // namespace
}  // namespace kiln::serving
