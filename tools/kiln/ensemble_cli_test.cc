// The final-training workflow as commands (Deep Learning with Python 18.1):
// `kiln tune --retrain_top K` retrains the best trials on train +
// validation data, `kiln ensemble` pools saved models with learned weights,
// and the saved ensemble runs in evaluate, show, predict, batch-predict and serve.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "kiln/core/io.h"
#include "kiln/core/json.h"
#include "kiln/ensemble/predictor.h"
#include "kiln/serving/rest/httplib.h"
#include "kiln/serving/test_process.h"
#include "kiln/testing/testing.h"

namespace kiln {
namespace ensemble_cli_test {  // named: this file shares a unity batch
namespace {

std::string q(const std::string& s) { return "'" + s + "'"; }

CommandResult kiln_run(const std::string& args) { return run_command(q(cli_path()) + " " + args + " 2>&1"); }

void write_file(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// Three overlapping classes of 4-feature points (so members differ).
std::string points(int rows, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> noise(0.0, 0.8);
  std::ostringstream os;
  os << "f0,f1,f2,f3,label\n";
  for (int i = 0; i < rows; ++i) {
    int c = i % 3;
    for (int k = 0; k < 4; ++k) os << (k == c ? 1.5 : 0.0) + noise(rng) << ",";
    os << c << "\n";
  }
  return os.str();
}

std::string saved_path(const std::string& output, const std::string& prefix) {
  auto pos = output.find(prefix);
  if (pos == std::string::npos) return "";
  std::string rest = output.substr(pos + prefix.size());
  return rest.substr(0, rest.find('\n'));
}

class EnsembleCli : public ::testing::Test {
 protected:
  void SetUp() override {
    csv_ = dir_.path() + "/points.csv";
    write_file(csv_, points(240, 3));
    data_ = Json{{"source", "csv"}, {"path", csv_}, {"label", "label"}, {"test_split", 0.25}};
  }
  // A `kiln train` spec over the points: `units` hidden units, `features` inputs.
  Json train_spec(int units, uint64_t seed, int features = 4) {
    Json data = data_;
    if (features != 4) {
      data["features"] = Json::array();
      for (int i = 0; i < features; ++i) data["features"].push_back("f" + std::to_string(i));
    }
    return Json{
        {"model",
         {{"layers",
           Json::array({Json{{"class_name", "Dense"}, {"config", {{"units", units}, {"activation", "relu"}}}},
                        Json{{"class_name", "Dense"}, {"config", {{"units", 3}, {"activation", "softmax"}}}}})}}},
        {"data", data},
        {"compile",
         {{"optimizer", {{"class_name", "Adam"}, {"config", {{"learning_rate", 0.02}}}}},
          {"loss", "sparse_categorical_crossentropy"},
          {"metrics", Json::array({"accuracy"})}}},
        {"fit", {{"epochs", 3}, {"batch_size", 32}, {"seed", seed}, {"verbose", 2}}}};
  }
  std::string train(const Json& spec, const std::string& base) {
    const std::string p = dir_.path() + "/spec_" + std::to_string(counter_++) + ".json";
    write_file(p, spec.dump());
    auto r = kiln_run("--threads 1 train " + q(p) + " --output " + q(base));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return saved_path(r.output, "Saved model to ");
  }
  // Two members under models/ (versions 1 and 2).
  void train_members() {
    m1_ = train(train_spec(8, 1), dir_.path() + "/models");
    m2_ = train(train_spec(3, 2), dir_.path() + "/models");
    ASSERT_EQ(m1_, dir_.path() + "/models/1");
    ASSERT_EQ(m2_, dir_.path() + "/models/2");
  }
  std::string data_arg() const { return q(data_.dump()); }

  TempDir dir_;
  std::string csv_, m1_, m2_;
  Json data_;
  int counter_ = 0;
};

TEST_F(EnsembleCli, EachWeightsModePrintsEveryMemberAndSavesTheNextVersion) {
  train_members();
  const std::string base = dir_.path() + "/ens";
  int version = 0;
  for (const std::string mode : {"average", "nelder_mead", "caruana"}) {
    ++version;
    auto r = kiln_run("--threads 1 ensemble --members " + q(m1_) + " " + q(m2_ + "/") + " --weights " + mode +
                      " --validation " + data_arg() + " --test " + data_arg() + " --output " + q(base));
    ASSERT_EQ(r.exit_code, 0) << mode << "\n" << r.output;
    // The table: a header and one row per member plus the ensemble.
    EXPECT_NE(r.output.find("val_accuracy"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("test_accuracy"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("\n" + m1_ + " "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("\n" + m2_ + " "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("\nensemble "), std::string::npos) << r.output;
    EXPECT_EQ(saved_path(r.output, "Saved ensemble to "), base + "/" + std::to_string(version)) << r.output;
    Json mj = read_json_file(base + "/" + std::to_string(version) + "/model.json");
    EXPECT_EQ(mj["class_name"], "Ensemble");
    auto& members = mj["config"]["members"];
    ASSERT_EQ(members.size(), 2u);
    const double w0 = members[0]["weight"].get<double>(), w1 = members[1]["weight"].get<double>();
    EXPECT_NEAR(w0 + w1, 1.0, 1e-9);
    if (mode == "average") EXPECT_DOUBLE_EQ(w0, 0.5);
    if (mode == "caruana") {  // counts / rounds: multiples of 1/total
      EXPECT_GT(std::max(w0, w1), 0.0);
    }
  }
  // Gradient-boosted trees as a third member, trained from --xgboost.
  auto r = kiln_run("--threads 1 ensemble --members " + q(m1_) + " --xgboost " +
                    q(Json{{"data", data_}, {"rounds", 5}, {"max_depth", 2}}.dump()) +
                    " --weights caruana --rounds 10 --validation " + data_arg() + " --output " + q(base));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\nxgboost "), std::string::npos) << r.output;
  EXPECT_EQ(saved_path(r.output, "Saved ensemble to "), base + "/4") << r.output;
  EXPECT_TRUE(path_exists(base + "/4/members/1/xgboost.json"));
}

TEST_F(EnsembleCli, MembersWithDifferentInputsAreRefusedInOneLine) {
  const std::string a = train(train_spec(4, 1), dir_.path() + "/four");
  const std::string b = train(train_spec(4, 1, /*features=*/3), dir_.path() + "/three");
  // stderr alone (run_command adds 2>&1 to what it is given).
  auto r = run_command("( " + q(cli_path()) + " ensemble --members " + q(a) + " " + q(b) + " --validation " +
                       data_arg() + " --output " + q(dir_.path() + "/ens") + " 2>&1 1>/dev/null )");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  std::istringstream lines(r.output);
  std::string first, second;
  std::getline(lines, first);
  EXPECT_FALSE(std::getline(lines, second) && !second.empty()) << r.output;
  EXPECT_EQ(first.rfind("kiln: error: ", 0), 0u) << first;
  for (const std::string& m : {a, b, std::string("(None, 4)"), std::string("(None, 3)")})
    EXPECT_NE(first.find(m), std::string::npos) << "'" << m << "' not in: " << first;
  EXPECT_FALSE(path_exists(dir_.path() + "/ens/1"));
}

TEST_F(EnsembleCli, TheSavedEnsembleRunsInEvaluateShowPredictBatchPredictAndServe) {
  train_members();
  const std::string base = dir_.path() + "/ens";
  auto r = kiln_run("--threads 1 ensemble --members " + q(m1_) + " " + q(m2_) + " --validation " + data_arg() +
                    " --output " + q(base));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string ens = base + "/1";

  // What the ensemble predicts, computed here.
  const int n = 5;
  at::Tensor x = at::randn({n, 4});
  at::Tensor want = ensemble::load_predictor(ens)->predict({x})[0];
  ASSERT_EQ(want.sizes(), (at::IntArrayRef{n, 3}));
  std::string instances;
  Json rows = Json::array();
  for (int i = 0; i < n; ++i) {
    Json row = Json::array();
    for (int k = 0; k < 4; ++k) row.push_back(x[i][k].item<float>());
    instances += row.dump() + "\n";
    rows.push_back(row);
  }
  write_file(dir_.path() + "/in.jsonl", instances);

  // kiln evaluate scores it as kiln ensemble scored it (its table's test columns).
  auto scored = kiln_run("--threads 1 ensemble --members " + q(m1_) + " " + q(m2_) + " --validation " + data_arg() +
                         " --test " + data_arg() + " --output " + q(dir_.path() + "/ens_scored"));
  ASSERT_EQ(scored.exit_code, 0) << scored.output;
  std::istringstream table(scored.output);
  std::string row_line;
  double test_accuracy = -1, test_loss = -1;
  while (std::getline(table, row_line)) {
    std::istringstream cols(row_line);
    std::string name, kind;
    double weight, val_accuracy, val_loss;
    if (cols >> name >> kind >> weight >> val_accuracy >> val_loss >> test_accuracy >> test_loss && name == "ensemble")
      break;
    test_accuracy = test_loss = -1;
  }
  ASSERT_GE(test_accuracy, 0) << scored.output;
  auto ev = kiln_run("--threads 1 evaluate " + q(ens) + " --data " + data_arg() + " --json");
  ASSERT_EQ(ev.exit_code, 0) << ev.output;
  Json metrics = Json::parse(ev.output.substr(ev.output.rfind('{')));
  EXPECT_EQ(metrics["split"], "test");
  EXPECT_NEAR(metrics["accuracy"].get<double>(), test_accuracy, 5e-5) << ev.output << scored.output;
  EXPECT_NEAR(metrics["loss"].get<double>(), test_loss, 5e-5) << ev.output << scored.output;

  auto show = kiln_run("show " + q(ens));
  ASSERT_EQ(show.exit_code, 0) << show.output;
  EXPECT_NE(show.output.find("Ensemble of 2 members"), std::string::npos) << show.output;
  EXPECT_NE(show.output.find("probabilities"), std::string::npos) << show.output;

  auto p = run_command(q(cli_path()) + " predict " + q(ens) + " --input " + q(dir_.path() + "/in.jsonl"));
  ASSERT_EQ(p.exit_code, 0) << p.output;
  std::istringstream lines(p.output);
  std::string line;
  int got = 0;
  for (; got < n && std::getline(lines, line); ++got)
    for (int k = 0; k < 3; ++k)
      EXPECT_NEAR(Json::parse(line)["predictions"][k].get<float>(), want[got][k].item<float>(), 1e-5) << line;
  EXPECT_EQ(got, n);

  auto bp = kiln_run("batch-predict --model " + q(ens) + " --input " + q(dir_.path() + "/in.jsonl") + " --output " +
                     q(dir_.path() + "/bp"));
  ASSERT_EQ(bp.exit_code, 0) << bp.output;
  std::istringstream shard(read_file(dir_.path() + "/bp/prediction.results-00000-of-00001"));
  got = 0;
  for (; std::getline(shard, line); ++got)
    for (int k = 0; k < 3; ++k)
      EXPECT_NEAR(Json::parse(line)["prediction"][k].get<float>(), want[got][k].item<float>(), 1e-5) << line;
  EXPECT_EQ(got, n);

  serving::testing::ChildProcess s({cli_path(), "serve", "--model_base_path", base, "--model_name", "ens",
                                    "--rest_api_port", "auto", "--port=-1", "--file_system_poll_wait_seconds", "0"},
                                   dir_.path() + "/serve.log");
  std::string ready = s.wait_for_line("kiln serve: ready", 60);
  ASSERT_FALSE(ready.empty()) << read_file(dir_.path() + "/serve.log");
  int port = 0;
  ASSERT_EQ(std::sscanf(ready.c_str(), "kiln serve: ready rest_port=%d", &port), 1) << ready;
  httplib::Client c("127.0.0.1", port);
  auto res = c.Post("/v1/models/ens:predict", Json{{"instances", rows}}.dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  Json pred = Json::parse(res->body)["predictions"];
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < 3; ++k) EXPECT_NEAR(pred[i][k].get<float>(), want[i][k].item<float>(), 1e-5);
  auto meta = c.Get("/v1/models/ens/metadata");
  ASSERT_TRUE(meta);
  EXPECT_NE(meta->body.find("probabilities"), std::string::npos) << meta->body;
  c.stop();
  EXPECT_EQ(s.stop(), 0);
}

TEST_F(EnsembleCli, RetrainTopRetrainsTheBestTrialsOnAllTrainingDataAndResumes) {
  Json train = train_spec(4, 1);
  train["model"]["layers"][0]["config"]["units"] = Json{{"hp", "units"}};
  train["fit"]["epochs"] = 2;
  train["fit"]["validation_split"] = 0.25;
  train["callbacks"] = Json::array({Json{{"class_name", "EarlyStopping"}, {"config", {{"patience", 5}}}}});
  Json tune{{"project_name", "p"},
            {"directory", dir_.path() + "/tuning"},
            {"tuner", "grid_search"},
            {"objective", "val_accuracy"},
            {"max_trials", 2},
            {"hyperparameters", Json::array({Json{{"type", "Choice"}, {"name", "units"}, {"values", {2, 8}}}})},
            {"train", train}};
  const std::string spec = dir_.path() + "/tune.json";
  write_file(spec, tune.dump());
  const std::string out = dir_.path() + "/retrained";
  auto r = kiln_run("--threads 1 tune " + q(spec) + " --retrain_top 2 --retrain_factor 1.5 --retrain_output " + q(out));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Retrained models"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("best_epoch"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("test_accuracy"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("callbacks left out of the retrain: EarlyStopping"), std::string::npos) << r.output;
  double previous_score = 2;
  std::set<std::string> trials;
  for (int rank = 1; rank <= 2; ++rank) {
    const std::string v = out + "/" + std::to_string(rank);
    ASSERT_TRUE(path_exists(v + "/model.json")) << r.output;
    Json info = read_json_file(v + "/assets/retrain.json");
    const int best = info["best_epoch"].get<int>();
    EXPECT_GE(best, 1);
    EXPECT_LE(best, 2);
    EXPECT_EQ(info["epochs"].get<int>(), (int)std::lround(best * 1.5));
    EXPECT_LE(info["score"].get<double>(), previous_score);  // ranked by val_accuracy, best first
    previous_score = info["score"].get<double>();
    trials.insert(info["trial_id"].get<std::string>());
    // Trained on every training row (no validation split), for those epochs.
    Json used = read_json_file(v + "/assets/train_spec.json");
    EXPECT_FALSE(used["fit"].contains("validation_split")) << used.dump();
    EXPECT_EQ(used["fit"]["epochs"], info["epochs"]);
    EXPECT_TRUE(used["callbacks"].empty()) << used.dump();
    EXPECT_EQ(used["model"]["layers"][0]["config"]["units"], info["hyperparameters"]["units"]);
  }
  EXPECT_EQ(trials.size(), 2u);
  EXPECT_FALSE(path_exists(out + "/3"));
  // Again on the finished project: the versions are kept, nothing retrains.
  auto again = kiln_run("--threads 1 tune " + q(spec) + " --resume --retrain_top 2 --retrain_output " + q(out));
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("exists: kept"), std::string::npos) << again.output;
  EXPECT_EQ(again.output.find("Saved model to"), std::string::npos) << again.output;
  // The retrained versions are members like any model.
  auto e = kiln_run("--threads 1 ensemble --members " + q(out + "/1") + " " + q(out + "/2") + " --validation " +
                    data_arg() + " --output " + q(dir_.path() + "/ens"));
  EXPECT_EQ(e.exit_code, 0) << e.output;
}

// --retrain_patch: the search runs on a subset for one epoch; the retrains
// take all the rows, a fixed epoch count and another learning rate.
TEST_F(EnsembleCli, RetrainPatchMergesIntoEachRetrainsSpec) {
  Json train = train_spec(4, 1);
  train["model"]["layers"][0]["config"]["units"] = Json{{"hp", "units"}};
  train["data"]["limit"] = 80;
  train["fit"]["epochs"] = 1;
  train["fit"]["validation_split"] = 0.25;
  Json tune{{"project_name", "p"},
            {"directory", dir_.path() + "/tuning"},
            {"tuner", "grid_search"},
            {"objective", "val_accuracy"},
            {"max_trials", 2},
            {"hyperparameters", Json::array({Json{{"type", "Choice"}, {"name", "units"}, {"values", {2, 8}}},
                                             Json{{"type", "Fixed"}, {"name", "lr"}, {"value", 0.01}}})},
            {"train", train}};
  const std::string spec = dir_.path() + "/tune.json";
  write_file(spec, tune.dump());
  // The patch may use the trial's values ({"hp": "lr"}), put in after it.
  const std::string patch = dir_.path() + "/patch.json";
  write_file(patch, R"({"data": {"limit": null}, "fit": {"epochs": 4},
                        "compile": {"optimizer": {"config": {"learning_rate": {"hp": "lr"}}}}})");
  const std::string out = dir_.path() + "/retrained";
  auto r = kiln_run("--threads 1 tune " + q(spec) + " --retrain_top 2 --retrain_patch " + q(patch) +
                    " --retrain_output " + q(out));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("retraining for 4 epochs"), std::string::npos) << r.output;
  for (int rank = 1; rank <= 2; ++rank) {
    const std::string v = out + "/" + std::to_string(rank);
    Json info = read_json_file(v + "/assets/retrain.json");
    EXPECT_EQ(info["epochs"].get<int>(), 4);
    Json used = read_json_file(v + "/assets/train_spec.json");
    EXPECT_EQ(used["fit"]["epochs"], 4) << used.dump();
    EXPECT_FALSE(used["data"].contains("limit")) << used.dump();  // null removes a key (RFC 7386)
    EXPECT_EQ(used["data"]["label"], "label") << used.dump();     // the rest of an object stays
    EXPECT_EQ(used["compile"]["optimizer"]["config"]["learning_rate"], 0.01) << used.dump();
    EXPECT_EQ(used["compile"]["optimizer"]["class_name"], "Adam") << used.dump();
    EXPECT_EQ(used["model"]["layers"][0]["config"]["units"], info["hyperparameters"]["units"]);
  }
  // Bad patches fail before the search, one line, exit 2.
  for (const auto& [arg, want] : std::vector<std::pair<std::string, std::string>>{
           {"--retrain_top 1 --retrain_patch '[1]'", "--retrain_patch must be a JSON object"},
           {"--retrain_top 1 --retrain_patch '{\"fit\": {\"epochs\": 0}}'", "fit.epochs must be a positive integer"},
           {"--retrain_patch '{}'", "--retrain_patch needs --retrain_top"},
       }) {
    auto bad = run_command("( " + q(cli_path()) + " tune " + q(spec) + " " + arg + " 2>&1 1>/dev/null )");
    EXPECT_EQ(bad.exit_code, 2) << arg << ": " << bad.output;
    EXPECT_NE(bad.output.find(want), std::string::npos) << arg << ": " << bad.output;
  }
}

TEST_F(EnsembleCli, RetrainTopNeedsATrainSpec) {
  Json tune{{"project_name", "c"},
            {"directory", dir_.path() + "/tuning"},
            {"max_trials", 1},
            {"objective", "val_accuracy"},
            {"hyperparameters", Json::array({Json{{"type", "Choice"}, {"name", "units"}, {"values", {2}}}})},
            {"command", "true"}};
  const std::string spec = dir_.path() + "/tune.json";
  write_file(spec, tune.dump());
  auto r = run_command("( " + q(cli_path()) + " tune " + q(spec) + " --retrain_top 1 2>&1 1>/dev/null )");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--retrain_top needs a tune spec with `train`"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace ensemble_cli_test
}  // namespace kiln
