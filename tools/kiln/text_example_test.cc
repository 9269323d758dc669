// The text example (examples/text_classifier.json) through `kiln train`:
// the spec as shipped, shrunk (less data, fewer epochs), trains from raw
// sentences (TextVectorization adapted on the training texts) well above
// chance (0.25), and the saved model directory carries the vocabulary and
// takes strings.
#include <gtest/gtest.h>

#include <fstream>

#include "kiln/core/json.h"
#include "kiln/core/string_tensor.h"
#include "kiln/models/model.h"
#include "kiln/testing/testing.h"

namespace kiln {
namespace {

TEST(TextExample, TextClassifierTrainsFromRawStrings) {
  Json spec = read_json_file(source_path("examples/text_classifier.json"));
  // Keep the model and the task; train briefly on less data.
  spec["data"]["train_size"] = 1200;
  spec["data"]["test_size"] = 400;
  spec["fit"]["epochs"] = 4;
  spec["fit"]["verbose"] = 2;
  TempDir dir;
  const std::string path = dir.path() + "/spec.json";
  std::ofstream(path) << spec.dump(2);

  auto r = run_command("'" + cli_path() + "' --threads 1 train '" + path + "' --output '" + dir.path() + "/models'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("each () string"), std::string::npos) << r.output;
  auto pos = r.output.find("test_accuracy: ");
  ASSERT_NE(pos, std::string::npos) << r.output;
  const double acc = std::stod(r.output.substr(pos + 15));
  EXPECT_GT(acc, 0.7) << r.output;  // chance is 0.25

  // The model directory: a string input in the signature, the adapted
  // vocabulary in model.json, and raw sentences in.
  const Json mj = read_json_file(dir.path() + "/models/1/model.json");
  const Json& inputs = mj["signatures"]["serving_default"]["inputs"];
  ASSERT_EQ(inputs.size(), 1u) << inputs.dump();
  EXPECT_EQ(inputs.begin().value()["dtype"], "string");
  EXPECT_NE(mj.dump().find("\"vocabulary\":[\""), std::string::npos);
  ModelPtr loaded = load_model(dir.path() + "/models/1");
  at::Tensor p = loaded->predict(strings::encode({"The striker scored a late goal!", "Bake the bread in a hot oven."}));
  EXPECT_EQ(sizes_of(p), (Shape{2, 4}));
}

}  // namespace
}  // namespace kiln
