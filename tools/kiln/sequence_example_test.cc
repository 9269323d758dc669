// The sequence example (examples/brackets_lstm.json) through `kiln train`:
// the spec as shipped, shrunk (less data, fewer epochs), must learn the
// generated "balanced brackets" task clearly above chance (0.5).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "kiln/core/json.h"
#include "kiln/testing/testing.h"

namespace kiln {
namespace {

TEST(SequenceExample, BracketsLstmLearnsAboveChance) {
  std::ifstream in(source_path("examples/brackets_lstm.json"));
  ASSERT_TRUE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  Json spec = Json::parse(text.str());
  // Keep the model and the task; train briefly on less data.
  spec["data"]["train_size"] = 2000;
  spec["data"]["test_size"] = 500;
  spec["fit"]["epochs"] = 3;
  spec["fit"]["verbose"] = 2;
  TempDir dir;
  spec["output"]["base_dir"] = dir.path() + "/models";
  const std::string path = dir.path() + "/spec.json";
  std::ofstream(path) << spec.dump(2);

  auto r = run_command("'" + cli_path() + "' --threads 1 train '" + path + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto pos = r.output.find("test_accuracy: ");
  ASSERT_NE(pos, std::string::npos) << r.output;
  const double acc = std::stod(r.output.substr(pos + 15));
  EXPECT_GT(acc, 0.8) << r.output;  // chance is 0.5
  // The saved model keeps the mask-producing Embedding and the LSTM.
  std::ifstream model(dir.path() + "/models/1/model.json");
  std::stringstream m;
  m << model.rdbuf();
  const std::string compact = Json::parse(m.str()).dump();
  EXPECT_NE(compact.find("\"mask_zero\":true"), std::string::npos) << compact;
  EXPECT_NE(compact.find("\"LSTM\""), std::string::npos) << compact;
}

}  // namespace
}  // namespace kiln
