// End-to-end tests of the `kiln` command line: they run the built binary
// (KILN_CLI) on small specs and check its files, output and exit codes.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>
#include <tuple>

#include "kiln/core/io.h"
#include "kiln/core/json.h"
#include "kiln/layers/dense.h"
#include "kiln/models/functional.h"
#include "kiln/models/model.h"
#include "kiln/plot/render.h"
#include "kiln/saving/safetensors.h"
#include "kiln/testing/testing.h"
#include "kiln/testing/xml.h"
namespace kiln {
namespace {

std::string q(const std::string& s) { return "'" + s + "'"; }

CommandResult kiln(const std::string& args) { return run_command(q(cli_path()) + " " + args); }

// Runs the CLI and returns only what it wrote to stderr (stdout dropped).
CommandResult kiln_stderr(const std::string& args) {
  return run_command("( " + q(cli_path()) + " " + args + " 2>&1 1>/dev/null )");
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(line);
  return out;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
}

// Three well-separated classes of 4-feature points.
std::string make_csv(int rows, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> noise(0.0, 0.3);
  std::ostringstream os;
  os << "f0,f1,f2,f3,label\n";
  for (int i = 0; i < rows; ++i) {
    int c = i % 3;
    for (int k = 0; k < 4; ++k) os << (k == c ? 2.0 : 0.0) + noise(rng) << ",";
    os << c << "\n";
  }
  return os.str();
}

Json csv_spec(const std::string& csv, const std::string& base) {
  Json s = Json::parse(R"({
    "model": {"layers": [{"class_name": "Dense", "config": {"units": 8, "activation": "relu"}},
                         {"class_name": "Dense", "config": {"units": 3, "activation": "softmax"}}]},
    "data": {"source": "csv", "label": "label", "test_split": 0.2},
    "compile": {"optimizer": {"class_name": "Adam", "config": {"learning_rate": 0.01}},
                "loss": "sparse_categorical_crossentropy", "metrics": ["accuracy"]},
    "fit": {"epochs": 3, "batch_size": 16, "seed": 3, "verbose": 2}
  })");
  s["data"]["path"] = csv;
  s["output"] = {{"base_dir", base}};
  return s;
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    csv_ = dir_.path() + "/points.csv";
    write_text(csv_, make_csv(150, 7));
    base_ = dir_.path() + "/models/points";
    spec_ = write_spec("spec.json", csv_spec(csv_, base_));
  }
  std::string write_spec(const std::string& name, const Json& spec) {
    std::string p = dir_.path() + "/" + name;
    write_text(p, spec.dump(2));
    return p;
  }
  // Trains the CSV spec and returns the saved version directory.
  std::string train(const std::string& extra = "") {
    auto r = kiln("--threads 1 train " + q(spec_) + " " + extra);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    auto pos = r.output.find("Saved model to ");
    EXPECT_NE(pos, std::string::npos) << r.output;
    if (pos == std::string::npos) return "";
    return lines_of(r.output.substr(pos + 15))[0];
  }
  // One line on stderr, "kiln: error: ...", and exit code 2.
  void expect_user_error(const std::string& args, const std::vector<std::string>& mentions) {
    auto r = kiln_stderr(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    auto lines = lines_of(r.output);
    ASSERT_EQ(lines.size(), 1u) << args << "\n" << r.output;
    EXPECT_EQ(lines[0].rfind("kiln: error: ", 0), 0u) << lines[0];
    for (auto& m : mentions) EXPECT_NE(lines[0].find(m), std::string::npos) << "'" << m << "' not in: " << lines[0];
  }

  TempDir dir_;
  std::string csv_, base_, spec_;
};

TEST_F(Cli, TrainSavesIncreasingVersionsAndIgnoresOtherEntries) {
  std::string v1 = train();
  EXPECT_EQ(v1, base_ + "/1");
  EXPECT_TRUE(path_exists(v1 + "/model.json"));
  EXPECT_TRUE(path_exists(v1 + "/weights.safetensors"));
  // Temp dirs, names that are not positive integers and files are skipped.
  make_dirs(base_ + "/.7.tmp-abc");
  make_dirs(base_ + "/latest");
  make_dirs(base_ + "/0");
  make_dirs(base_ + "/03");
  write_text(base_ + "/5", "not a directory");
  EXPECT_EQ(train(), base_ + "/2");
  EXPECT_FALSE(path_exists(base_ + "/3"));
  // --output overrides output.base_dir.
  EXPECT_EQ(train("--output " + q(dir_.path() + "/elsewhere")), dir_.path() + "/elsewhere/1");
}

TEST_F(Cli, TrainPrintsTestMetricsAndShowPrintsTheSignature) {
  auto r = kiln("--threads 1 train " + q(spec_));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("test_loss: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("test_accuracy: "), std::string::npos) << r.output;

  auto s = kiln("show " + q(base_ + "/1"));
  ASSERT_EQ(s.exit_code, 0) << s.output;
  for (const char* want : {"signature_def['serving_default']", "shape: (-1, 4)", "shape: (-1, 3)", "dtype: float32",
                           "Method name is: predict", "Total params: 67", "Trainable params: 67",
                           "Non-trainable params: 0", "Dense", "sparse_categorical_crossentropy"})
    EXPECT_NE(s.output.find(want), std::string::npos) << "'" << want << "' not in:\n" << s.output;
}

TEST_F(Cli, PredictRoundTripsJsonLinesInOrder) {
  std::string v = train();
  ASSERT_FALSE(v.empty());
  auto model = load_model(v);
  std::string input_name = model->input_names().at(0);
  const int n = 37;
  auto x = at::randn({n, 4});
  std::ostringstream in;
  for (int i = 0; i < n; ++i) {
    Json row = Json::array();
    for (int k = 0; k < 4; ++k) row.push_back(x[i][k].item<float>());
    if (i % 3 == 0)
      in << row.dump() << "\n";
    else if (i % 3 == 1)
      in << Json{{"inputs", row}}.dump() << "\n";
    else
      in << Json{{input_name, row}}.dump() << "\n";
    if (i == 10) in << "\n";  // blank lines are skipped
  }
  write_text(dir_.path() + "/in.jsonl", in.str());
  auto r = kiln("predict " + q(v) + " --input " + q(dir_.path() + "/in.jsonl") + " --output " +
                q(dir_.path() + "/out.jsonl") + " --batch_size 8");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto out = lines_of(read_file(dir_.path() + "/out.jsonl"));
  ASSERT_EQ(out.size(), (size_t)n);
  // The values re-read equal the float32s an in-process prediction gives.
  auto want = model->predict(x, {.batch_size = 32});
  for (int i = 0; i < n; ++i) {
    Json j = Json::parse(out[i]);
    ASSERT_TRUE(j.contains("predictions")) << out[i];
    ASSERT_EQ(j["predictions"].size(), 3u) << out[i];
    for (int k = 0; k < 3; ++k)
      EXPECT_NEAR(j["predictions"][k].get<double>(), want[i][k].item<double>(), 1e-6) << "row " << i;
  }
  // stdin to stdout works the same.
  auto piped = run_command("cat " + q(dir_.path() + "/in.jsonl") + " | " + q(cli_path()) + " predict " + q(v));
  ASSERT_EQ(piped.exit_code, 0) << piped.output;
  EXPECT_EQ(lines_of(piped.output), out);
}

// A model directory whose weights.safetensors is a FIFO (issue 30 §6):
// show and predict refuse it with one line and exit 2 instead of hanging
// in open(). `timeout` bounds the run should they hang (exit 124).
TEST_F(Cli, ShowAndPredictRefuseAWeightsFileThatIsAFifo) {
  auto x = layers::Input({4}, at::kFloat, "x");
  auto y = layers::Dense(2)(x);
  const std::string v = dir_.path() + "/fifo/1";
  models::Functional(KerasTensors{x}, KerasTensors{y})->save(v);
  const std::string w = v + "/weights.safetensors";
  ASSERT_EQ(::unlink(w.c_str()), 0);
  ASSERT_EQ(::mkfifo(w.c_str(), 0600), 0);
  write_text(dir_.path() + "/one.jsonl", "[1, 2, 3, 4]\n");
  const std::string want = w + " is not a regular file (a FIFO); kiln reads only regular files: replace it with one";
  for (const std::string& args : {"show " + q(v), "predict " + q(v) + " --input " + q(dir_.path() + "/one.jsonl")}) {
    auto r = run_command("timeout 20 " + q(cli_path()) + " " + args + " 2>&1");
    EXPECT_EQ(r.exit_code, 2) << args << ":\n" << r.output;
    auto lines = lines_of(r.output);
    ASSERT_EQ(lines.size(), 1u) << args << ":\n" << r.output;
    EXPECT_NE(lines[0].find(want), std::string::npos) << lines[0];
  }
}

// Regression: the output names were read through a sub-object of a
// destroyed temporary (use after free) and came out as output_0/output_1.
TEST_F(Cli, PredictNamesTheOutputsOfATwoOutputModel) {
  auto x = layers::Input({4}, at::kFloat, "x");
  auto digit = layers::Dense(3, "softmax", Json{{"name", "digit"}})(x);
  auto sign = layers::Dense(1, "sigmoid", Json{{"name", "sign"}})(x);
  auto model = models::Functional(KerasTensors{x}, KerasTensors{digit, sign});
  const std::string v = dir_.path() + "/two/1";
  model->save(v);
  write_text(dir_.path() + "/two.jsonl", "[1, 2, 3, 4]\n[0.5, -1, 0, 2]\n");
  auto r = kiln("predict " + q(v) + " --input " + q(dir_.path() + "/two.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto out = lines_of(r.output);
  ASSERT_EQ(out.size(), 2u) << r.output;
  auto want = model->predict(Tensors{at::tensor({1.f, 2.f, 3.f, 4.f, 0.5f, -1.f, 0.f, 2.f}).reshape({2, 4})});
  for (size_t i = 0; i < out.size(); ++i) {
    Json p = Json::parse(out[i]).at("predictions");
    std::vector<std::string> keys;
    for (auto& [k, val] : p.items()) keys.push_back(k);
    EXPECT_EQ(keys, (std::vector<std::string>{"digit", "sign"})) << out[i];
    ASSERT_TRUE(p.contains("digit") && p.contains("sign")) << out[i];
    for (int k = 0; k < 3; ++k) EXPECT_NEAR(p["digit"][k].get<double>(), want[0][i][k].item<double>(), 1e-6);
    EXPECT_NEAR(p["sign"][0].get<double>(), want[1][i][0].item<double>(), 1e-6);
  }
}

TEST_F(Cli, TrainPlotWritesTheHistoryWithTrainAndValidationCurves) {
  Json spec = csv_spec(csv_, base_);
  spec["fit"]["validation_split"] = 0.2;
  // EarlyStopping ends the run early; the plot is still written, with the epochs that ran.
  spec["callbacks"] = Json::parse(R"([{"class_name": "EarlyStopping",
                                       "config": {"monitor": "loss", "patience": 0, "min_delta": 100}}])");
  const std::string path = write_spec("plotted.json", spec);
  const std::string svg = dir_.path() + "/history.svg";
  auto r = kiln("--threads 1 train " + q(path) + " --plot " + q(svg));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Wrote " + svg), std::string::npos) << r.output;
  auto root = parse_xml(read_file(svg));
  auto panels = root->find_all("g", "panel");
  ASSERT_EQ(panels.size(), 2u);  // loss, accuracy
  std::vector<std::string> titles, legend;
  for (auto* p : panels) titles.push_back(p->find_all("text", "panel-title")[0]->text);
  EXPECT_EQ(titles, (std::vector<std::string>{"loss", "accuracy"}));
  for (auto* t : panels[0]->find_all("text", "legend-label")) legend.push_back(t->text);
  EXPECT_EQ(legend, (std::vector<std::string>{"train", "validation"}));
  // patience 0 with an unreachable min_delta: the second epoch stops the run, 2 of 3 epochs.
  EXPECT_EQ(panels[0]->find_all("circle", "marker").size(), 4u);
  EXPECT_EQ(root->find_all("text", "figure-title")[0]->text, "kiln train: plotted");

  if (plot::png_supported()) {
    const std::string png = dir_.path() + "/history.png";
    auto p = kiln("--threads 1 train " + q(spec_) + " --epochs 1 --plot " + q(png));
    ASSERT_EQ(p.exit_code, 0) << p.output;
    EXPECT_EQ(read_file(png).substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  }
  // A name that is neither .svg nor .png fails before training, with the fix.
  expect_user_error("train " + q(spec_) + " --plot " + q(dir_.path() + "/history.jpg"),
                    {".svg or .png", "history.jpg"});
  EXPECT_FALSE(path_exists(base_ + "/3"));
}

TEST_F(Cli, EvaluatePrintsMetrics) {
  std::string v = train();
  auto r = kiln("evaluate " + q(v) + " --spec " + q(spec_));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("loss: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("accuracy: "), std::string::npos) << r.output;
  Json data{{"source", "csv"}, {"path", csv_}, {"label", "label"}};
  auto j = kiln("evaluate " + q(v) + " --json --data " + q(data.dump()));
  ASSERT_EQ(j.exit_code, 0) << j.output;
  Json m = Json::parse(lines_of(j.output).back());
  EXPECT_EQ(m["split"], "train");
  EXPECT_EQ(m["examples"], 150);
  EXPECT_GE(m["accuracy"].get<double>(), 0.0);
}

TEST_F(Cli, UserErrorsAreOneLineAndExitTwo) {
  expect_user_error("train " + q(dir_.path() + "/missing.json"), {"missing.json"});
  write_text(dir_.path() + "/bad.json", "{\"model\": {\"builtin\": \"mlp\"},,}");
  expect_user_error("train " + q(dir_.path() + "/bad.json"), {"bad.json"});

  Json unknown_layer = csv_spec(csv_, base_);
  unknown_layer["model"]["layers"][0]["class_name"] = "Dnse";
  expect_user_error("train " + q(write_spec("unknown_layer.json", unknown_layer)), {"Dnse", "Dense", "Dropout"});

  Json bad_key = csv_spec(csv_, base_);
  bad_key["fitt"] = Json::object();
  expect_user_error("train " + q(write_spec("bad_key.json", bad_key)), {"fitt", "fit"});

  Json bad_source = csv_spec(csv_, base_);
  bad_source["data"]["source"] = "parquet";
  expect_user_error("train " + q(write_spec("bad_source.json", bad_source)), {"parquet", "csv"});

  // The model says 5 features, the data has 4.
  Json mismatch = csv_spec(csv_, base_);
  mismatch["model"]["input_shape"] = {5};
  expect_user_error("--threads 1 train " + q(write_spec("mismatch.json", mismatch)), {});

  expect_user_error("train " + q(spec_) + " --bogus", {"--bogus"});
  expect_user_error("frobnicate", {"frobnicate"});
  expect_user_error("--threads 0 show x", {"threads"});
  expect_user_error("show " + q(dir_.path() + "/nope"), {"nope"});
  EXPECT_FALSE(path_exists(base_)) << "no version may be written by a failed run";

  std::string v = train();
  write_text(dir_.path() + "/narrow.jsonl", "[1, 2, 3, 4]\n[1, 2, 3]\n");
  expect_user_error("predict " + q(v) + " --input " + q(dir_.path() + "/narrow.jsonl"), {"line 2", "(4", "(3"});
  write_text(dir_.path() + "/notjson.jsonl", "[1, 2, 3, 4]\n{oops\n");
  expect_user_error("predict " + q(v) + " --input " + q(dir_.path() + "/notjson.jsonl"), {"line 2"});
  write_text(dir_.path() + "/ragged.jsonl", "[[1, 2], [3]]\n");
  expect_user_error("predict " + q(v) + " --input " + q(dir_.path() + "/ragged.jsonl"), {"line 1"});
}

// --device on every command that computes, and the spec's "device": a
// device this machine lacks is one line and exit 2 naming what there is,
// and nothing is written; "cpu" trains as before.
TEST_F(Cli, DeviceFlagAndSpecDeviceNameWhatThisMachineHas) {
  expect_user_error("--device tpu:0 train " + q(spec_), {"--device: 'tpu:0'", "cuda:N"});
  // More GPUs than any machine here has (none on CI).
  expect_user_error("train " + q(spec_) + " --device cuda:64", {"--device cuda:64", "cpu"});
  expect_user_error("--device cuda:64 predict " + q(dir_.path() + "/nope"), {"cuda:64"});
  Json on_gpu = csv_spec(csv_, base_);
  on_gpu["device"] = "cuda:64";
  expect_user_error("--threads 1 train " + q(write_spec("on_gpu.json", on_gpu)), {"the spec's `device`", "cuda:64"});
  on_gpu["device"] = 3;
  expect_user_error("--threads 1 train " + q(write_spec("bad_device.json", on_gpu)), {"`device`", "cuda:N"});
  EXPECT_FALSE(path_exists(base_)) << "no version may be written by a failed run";
  // --device wins over the spec's: this trains on the CPU.
  on_gpu["device"] = "cuda:64";
  auto r = kiln("--threads 1 --device cpu train " + q(write_spec("cpu_wins.json", on_gpu)));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(path_exists(base_ + "/1/model.json"));
  auto sys = kiln("show --system");
  ASSERT_EQ(sys.exit_code, 0) << sys.output;
  EXPECT_NE(sys.output.find("GPUs: "), std::string::npos) << sys.output;
}

// A user error whose one line stays short: exit 2 (a crash would be a
// signal), one "kiln: error:" line, at most `max_len` bytes, naming `mentions`.
void expect_short_error(const std::string& args, const std::vector<std::string>& mentions, size_t max_len = 400) {
  auto r = kiln_stderr(args);
  EXPECT_EQ(r.exit_code, 2) << args.substr(0, 200) << "\n" << r.output.substr(0, 2000);
  auto lines = lines_of(r.output);
  ASSERT_EQ(lines.size(), 1u) << r.output.substr(0, 2000);
  EXPECT_EQ(lines[0].rfind("kiln: error: ", 0), 0u) << lines[0].substr(0, 400);
  EXPECT_LE(lines[0].size(), max_len) << lines[0].substr(0, 2000);
  for (auto& m : mentions)
    EXPECT_NE(lines[0].find(m), std::string::npos) << "'" << m << "' not in: " << lines[0].substr(0, 2000);
}

std::string nested_lists(size_t depth, const std::string& leaf = "1") {
  return std::string(depth, '[') + leaf + std::string(depth, ']');
}

std::string nested_objects(size_t depth) {
  std::string s;
  for (size_t i = 0; i < depth; ++i) s += "{\"a\":";
  return s + "1" + std::string(depth, '}');
}

// Regression: a JSON Lines instance nested 50,000 deep crashed `kiln predict`
// with SIGSEGV (recursion), and a 200,000-deep spec crashed `kiln train`
// while it built its error message (at 50,000 it printed a 100 KB line).
// Every reader of JSON text refuses more than 64 levels before parsing.
TEST_F(Cli, DeeplyNestedJsonIsOneShortErrorLineInEveryReader) {
  std::string v = train();
  ASSERT_FALSE(v.empty());
  for (size_t depth : {50000, 200000}) {
    SCOPED_TRACE(depth);
    const std::string d = std::to_string(depth);
    // JSON Lines instances (kiln predict): the line is named.
    write_text(dir_.path() + "/deep.jsonl", "[1, 2, 3, 4]\n" + nested_lists(depth) + "\n");
    expect_short_error("predict " + q(v) + " --input " + q(dir_.path() + "/deep.jsonl"), {"line 2", "64 levels"});
    // Train specs: a deep value, and a deep spec.
    write_text(dir_.path() + "/deep_value.json",
               "{\"model\": " + nested_lists(depth) + ", \"data\": {\"source\": \"csv\", \"path\": \"x.csv\"}}");
    expect_short_error("train " + q(dir_.path() + "/deep_value.json"), {"deep_value.json", "64 levels"});
    write_text(dir_.path() + "/deep_spec.json", nested_objects(depth));
    expect_short_error("train " + q(dir_.path() + "/deep_spec.json"), {"deep_spec.json", "64 levels"});
    // A JSON Lines data file named by a spec.
    write_text(dir_.path() + "/deep_data.jsonl",
               "{\"x\": [1, 2], \"y\": 0}\n{\"x\": " + nested_lists(depth) + ", \"y\": 1}\n");
    Json data_spec = csv_spec(csv_, base_);
    data_spec["data"] = {
        {"source", "jsonl"}, {"path", dir_.path() + "/deep_data.jsonl"}, {"features", {"x"}}, {"label", "y"}};
    expect_short_error("train " + q(write_spec("deep_data_spec.json", data_spec)), {"deep_data.jsonl:2", "64 levels"});
    // model.json of a model directory.
    make_dirs(dir_.path() + "/deep_model/1");
    write_text(dir_.path() + "/deep_model/1/model.json", nested_objects(depth));
    expect_short_error("show " + q(dir_.path() + "/deep_model/1"), {"model.json", "64 levels"});
    expect_short_error("predict " + q(dir_.path() + "/deep_model/1") + " --input " + q(dir_.path() + "/deep.jsonl"),
                       {"model.json", "64 levels"});
    // Tune specs and server configs.
    write_text(dir_.path() + "/deep_tune.json", "{\"tuner\": " + nested_lists(depth) + "}");
    expect_short_error("tune " + q(dir_.path() + "/deep_tune.json"), {"deep_tune.json", "64 levels"});
    write_text(dir_.path() + "/deep.config", "{\"model_config_list\": " + nested_lists(depth) + "}");
    expect_short_error("serve --rest_api_port 0 --model_config_file " + q(dir_.path() + "/deep.config"), {"64 levels"});
  }
  EXPECT_FALSE(path_exists(base_ + "/2")) << "no version may be written by a failed run";
}

// Error messages quote at most a short prefix of a bad value.
TEST_F(Cli, ErrorsQuoteOnlyAPrefixOfABadValue) {
  Json wide = csv_spec(csv_, base_);
  wide["data"] = Json::array();
  for (int i = 0; i < 100000; ++i) wide["data"].push_back(i);
  expect_short_error("train " + q(write_spec("wide.json", wide)), {"`data` section", "[0,1,2,", "..."});
  Json deep_ok = csv_spec(csv_, base_);  // under the depth limit, still quoted short
  deep_ok["compile"]["metrics"] = Json::parse(nested_objects(60));
  expect_short_error("train " + q(write_spec("deep_ok.json", deep_ok)), {"`metrics`[\"a\"]", "{\"a\":{\"a\":"});
  std::string v = train();
  ASSERT_FALSE(v.empty());
  write_text(dir_.path() + "/text.jsonl", "[1, 2, 3, \"" + std::string(100000, 'x') + "\"]\n");
  expect_short_error("predict " + q(v) + " --input " + q(dir_.path() + "/text.jsonl"), {"line 1", "xxx..."});
}

// Regression: a CSV holding NaN/inf trained to a model of NaN weights, which
// was saved with exit 0.
TEST_F(Cli, NonFiniteDataIsRefusedAndANaNModelIsNeverPublished) {
  std::string text = make_csv(150, 7);
  auto nl = text.find('\n', text.find('\n', text.find('\n') + 1) + 1);  // after line 3
  std::string bad = text.substr(0, nl + 1) + "0.1,nan,0.3,0.4,1\n" + text.substr(nl + 1);
  write_text(dir_.path() + "/nan.csv", bad);
  Json spec = csv_spec(dir_.path() + "/nan.csv", base_);
  expect_short_error("--threads 1 train " + q(write_spec("nan.json", spec)),
                     {"nan.csv:4", "row 3", "column 'f1'", "nan", "allow_non_finite"});
  EXPECT_FALSE(path_exists(base_));

  // Allowed on request: training then ends with NaN weights, which are
  // never published.
  spec["data"]["allow_non_finite"] = true;
  expect_short_error("--threads 1 train " + q(write_spec("nan_allowed.json", spec)),
                     {"non-finite weights", "not saved"});
  EXPECT_FALSE(path_exists(base_ + "/1")) << "a model with NaN weights was published";

  // Divergence without bad data is caught the same way.
  Json diverge = csv_spec(csv_, base_);
  diverge["compile"]["optimizer"] = {{"class_name", "SGD"}, {"config", {{"learning_rate", 1e30}}}};
  expect_short_error("--threads 1 train " + q(write_spec("diverge.json", diverge)), {"non-finite weights"});
  EXPECT_FALSE(path_exists(base_ + "/1"));
}

// Regression: user mistakes that reached a library exception ended as
// "internal error", exit 1.
TEST_F(Cli, ConfigValuesOutOfRangeAreUserErrors) {
  Json huge = csv_spec(csv_, base_);
  huge["model"]["layers"][0]["config"]["units"] = 1e12;
  expect_short_error("--threads 1 train " + q(write_spec("huge.json", huge)),
                     {"units=", "positive integer up to 16777216"});
  huge["model"]["layers"][0]["config"]["units"] = 1.5;
  expect_short_error("--threads 1 train " + q(write_spec("frac.json", huge)), {"units"});

  // A Functional model.json whose output refers to a node the layer lacks.
  auto x = layers::Input({4}, at::kFloat, "x");
  auto y = layers::Dense(3, "softmax", Json{{"name", "head"}})(x);
  auto model = models::Functional(KerasTensors{x}, KerasTensors{y});
  const std::string v = dir_.path() + "/func/1";
  model->save(v);
  const std::string original = read_file(v + "/model.json");
  Json mj = Json::parse(original);
  ASSERT_EQ(mj["config"]["output_layers"][0][0], "head");
  for (auto [node, index, mention] :
       {std::tuple{5, 0, "has nodes 0..0"}, std::tuple{-1, 0, "indices >= 0"}, std::tuple{0, 7, "has 1 output(s)"}}) {
    mj["config"]["output_layers"][0][1] = node;
    mj["config"]["output_layers"][0][2] = index;
    write_text(v + "/model.json", mj.dump());
    expect_short_error("show " + q(v), {"head", mention});
  }
  mj["config"]["output_layers"][0] = "head";
  write_text(v + "/model.json", mj.dump());
  expect_short_error("show " + q(v), {"[layer_name, node_index, tensor_index]"});
}

// Regression: `batch_size: 1e308` was reported as -9223372036854775808 (a
// double converted to an integer out of range). Integers in a spec are
// range-checked and must be whole; 3.0 still reads as 3.
TEST_F(Cli, SpecIntegersOutOfRangeOrWithAFractionAreNamedNotWrapped) {
  Json s = csv_spec(csv_, base_);
  s["fit"]["batch_size"] = 1e308;
  auto r = kiln_stderr("train " + q(write_spec("huge.json", s)));
  EXPECT_EQ(r.output.find("batch_size=-9223372036854775808"), std::string::npos) << r.output;
  expect_short_error("train " + q(write_spec("huge.json", s)),
                     {"`fit.batch_size`", "batch_size=1e+308", "out of range"});
  s["fit"]["batch_size"] = 2.5;
  expect_short_error("train " + q(write_spec("frac.json", s)), {"`fit.batch_size`", "whole number", "2.5"});
  s["fit"]["batch_size"] = 16;
  s["fit"]["epochs"] = 3e9;  // beyond int
  expect_short_error("train " + q(write_spec("epochs.json", s)), {"`fit.epochs`", "out of range", "2147483647"});
  s["fit"]["epochs"] = 1;
  s["callbacks"] = {{{"class_name", "EarlyStopping"}, {"config", {{"patience", -1e300}}}}};
  expect_short_error("train " + q(write_spec("patience.json", s)), {"callbacks[0] (EarlyStopping)", "`patience`"});
  s["callbacks"] = {{{"class_name", "EarlyStopping"}, {"config", {{"patience", 2.0}}}}};
  s["data"]["limit"] = 1e19;
  expect_short_error("train " + q(write_spec("limit.json", s)), {"`data.limit`", "out of range"});
  s["data"]["limit"] = 120.0;
  s["fit"]["epochs"] = 1.0;
  auto ok = kiln("--threads 1 train " + q(write_spec("whole.json", s)));
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
}

// Regression: a key given twice in a spec passed silently, the last one
// winning. It is one line naming the key and the object, exit 2.
TEST_F(Cli, SpecKeysGivenTwiceAreRefused) {
  Json s = csv_spec(csv_, base_);
  s["callbacks"] = {{{"class_name", "EarlyStopping"}, {"config", {{"monitor", "loss"}}}}};
  std::string text = s.dump();
  auto twice = [&](const std::string& once, const std::string& doubled) {
    std::string t = text;
    const size_t at = t.find(once);
    EXPECT_NE(at, std::string::npos) << once;
    return t.replace(at, once.size(), doubled);
  };
  write_text(dir_.path() + "/fit.json", twice("\"epochs\":3", "\"epochs\":3,\"epochs\":1000"));
  expect_short_error("train " + q(dir_.path() + "/fit.json"), {"fit.json", "`epochs` twice", "`fit`", "remove one"});
  write_text(dir_.path() + "/cb.json", twice("\"monitor\":\"loss\"", "\"monitor\":\"loss\",\"monitor\":\"val_loss\""));
  expect_short_error("train " + q(dir_.path() + "/cb.json"), {"`monitor` twice", "`callbacks[0].config`"});
  write_text(dir_.path() + "/top.json", twice("\"fit\":", "\"fit\":{},\"fit\":"));
  expect_short_error("train " + q(dir_.path() + "/top.json"), {"`fit` twice", "the top-level object"});
  // The same key in two different objects is fine.
  write_text(dir_.path() + "/ok.json", text);
  auto ok = kiln("--threads 1 train " + q(dir_.path() + "/ok.json"));
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
}

// Regression: ReduceLROnPlateau with a learning-rate schedule failed only
// when the plateau first fired, mid-training, with exit 1 (and a restarted
// job failed there again). It is refused when the spec is read.
TEST_F(Cli, ReduceLROnPlateauWithAScheduleIsRefusedBeforeTraining) {
  Json s = csv_spec(csv_, base_);
  s["compile"]["optimizer"]["config"]["learning_rate"] = Json::parse(
      R"({"class_name": "ExponentialDecay", "config": {"initial_learning_rate": 0.01, "decay_steps": 10,
                                                        "decay_rate": 0.9}})");
  // Nothing improves by 100: the plateau would fire at the second epoch.
  s["callbacks"] = Json::parse(
      R"([{"class_name": "ReduceLROnPlateau", "config": {"monitor": "loss", "patience": 1, "min_delta": 100}}])");
  const std::string spec = write_spec("schedule.json", s);
  auto r = kiln("--threads 1 train " + q(spec));
  EXPECT_EQ(r.output.find("Epoch"), std::string::npos) << r.output;
  expect_short_error("--threads 1 train " + q(spec),
                     {"ReduceLROnPlateau", "ExponentialDecay", "constant learning_rate", "drop the callback"});
  EXPECT_FALSE(path_exists(base_));
}

TEST_F(Cli, HelpExitsZero) {
  auto r = kiln("--help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* cmd : {"train", "evaluate", "predict", "show"}) EXPECT_NE(r.output.find(cmd), std::string::npos);
  auto t = kiln("train --help");
  EXPECT_EQ(t.exit_code, 0) << t.output;
  EXPECT_NE(t.output.find("--epochs"), std::string::npos) << t.output;
}

TEST_F(Cli, TrainsBuiltinModelsOnASliceOfFashionMnist) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)";
  Json mlp = Json::parse(R"({
    "model": {"builtin": "mlp", "args": {"hidden_units": [32], "dropout": 0.1}},
    "data": {"source": "fashion_mnist", "scale": "1/255", "flatten": true, "limit": 1000, "test_limit": 500},
    "fit": {"epochs": 2, "batch_size": 64, "validation_split": 0.1, "seed": 1, "verbose": 2}
  })");
  mlp["output"] = {{"base_dir", dir_.path() + "/fm"}};
  auto r = kiln("--threads 1 train " + q(write_spec("mlp.json", mlp)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("test_accuracy: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("val_loss"), std::string::npos) << r.output;
  auto s = kiln("show " + q(dir_.path() + "/fm/1"));
  EXPECT_NE(s.output.find("shape: (-1, 784)"), std::string::npos) << s.output;

  Json cnn = Json::parse(R"({
    "model": {"builtin": "cnn", "args": {"filters": [4, 8]}},
    "data": {"source": "fashion_mnist", "scale": "1/255", "reshape": [28, 28, 1], "limit": 256, "test_limit": 128},
    "fit": {"epochs": 1, "batch_size": 64, "seed": 1, "verbose": 2}
  })");
  cnn["output"] = {{"base_dir", dir_.path() + "/fm"}};
  auto c = kiln("--threads 1 train " + q(write_spec("cnn.json", cnn)));
  ASSERT_EQ(c.exit_code, 0) << c.output;
  auto cs = kiln("show " + q(dir_.path() + "/fm/2"));
  EXPECT_NE(cs.output.find("shape: (-1, 28, 28, 1)"), std::string::npos) << cs.output;
  EXPECT_NE(cs.output.find("Conv2D"), std::string::npos) << cs.output;
}

// --- kill -9 and resume -------------------------------------------------------

// Starts the CLI in the background with output to `log`; returns its pid.
pid_t spawn_cli(const std::vector<std::string>& args, const std::string& log) {
  std::vector<std::string> argv = {cli_path()};
  argv.insert(argv.end(), args.begin(), args.end());
  return spawn_logged(argv, log);
}

TEST_F(Cli, KilledTrainingResumesFromBackupBitForBit) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)";
  auto spec_for = [&](const std::string& name) {
    Json s = Json::parse(R"({
      "model": {"builtin": "mlp", "args": {"hidden_units": [128, 128], "dropout": 0.2}},
      "data": {"source": "fashion_mnist", "scale": "1/255", "flatten": true, "limit": 6000, "test_limit": 500},
      "fit": {"epochs": 4, "batch_size": 32, "validation_split": 0.1, "seed": 11, "verbose": 2}
    })");
    s["callbacks"] =
        Json::array({Json{{"class_name", "BackupAndRestore"},
                          {"config", {{"backup_dir", dir_.path() + "/backup_" + name}, {"save_freq", 40}}}}});
    s["output"] = {{"base_dir", dir_.path() + "/out_" + name}};
    return write_spec(name + ".json", s);
  };
  const std::string killed_spec = spec_for("killed"), clean_spec = spec_for("clean");
  const std::string backup = dir_.path() + "/backup_killed";

  // Start, wait for the first checkpoint (bounded), SIGKILL.
  pid_t pid = spawn_cli({"--threads", "1", "train", killed_spec}, dir_.path() + "/killed.log");
  ASSERT_GT(pid, 0);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  bool seen = false;
  int status = 0;
  bool exited = false;
  while (std::chrono::steady_clock::now() < deadline) {
    if (has_checkpoint(backup)) {
      seen = true;
      break;
    }
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      exited = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (!exited) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  ASSERT_TRUE(seen) << "no checkpoint appeared in " << backup << "; log:\n" << read_file(dir_.path() + "/killed.log");
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << "training finished before it could be killed; log:\n"
      << read_file(dir_.path() + "/killed.log");
  EXPECT_FALSE(path_exists(dir_.path() + "/out_killed/1")) << "a killed run must not publish a version";

  // The same command again resumes and finishes.
  auto resumed = kiln("--threads 1 train " + q(killed_spec));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  auto clean = kiln("--threads 1 train " + q(clean_spec));
  ASSERT_EQ(clean.exit_code, 0) << clean.output;

  auto a = load_safetensors(dir_.path() + "/out_killed/1/weights.safetensors");
  auto b = load_safetensors(dir_.path() + "/out_clean/1/weights.safetensors");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(at::equal(a[i].second, b[i].second)) << a[i].first << " differs after resume";
  }
}

// A spec with two named inputs and two named outputs: CSV columns per input
// and a label column per output, a Keras 3 Functional config, a loss and
// metrics per output and loss_weights. Keras's per-output logs come out of
// fit (with val_), the test evaluation and `kiln evaluate`.
TEST_F(Cli, TrainsATwoInputTwoOutputSpec) {
  std::mt19937_64 rng(5);
  std::normal_distribution<double> noise(0.0, 0.3);
  std::ostringstream csv;
  csv << "f0,f1,f2,e0,digit,sign\n";
  for (int i = 0; i < 150; ++i) {
    const int c = i % 3;
    for (int k = 0; k < 3; ++k) csv << (k == c ? 2.0 : 0.0) + noise(rng) << ",";
    const double e = noise(rng) * 4;
    csv << e << "," << c << "," << (e > 0 ? 1 : 0) << "\n";
  }
  write_text(dir_.path() + "/two.csv", csv.str());
  auto kt = [](const char* layer, int width) {
    return Json{{"class_name", "__keras_tensor__"},
                {"config", {{"shape", {nullptr, width}}, {"dtype", "float32"}, {"keras_history", {layer, 0, 0}}}}};
  };
  auto input = [](const char* name, int width) {
    return Json{
        {"module", "keras.layers"},
        {"class_name", "InputLayer"},
        {"config", {{"batch_shape", {nullptr, width}}, {"dtype", "float32"}, {"sparse", false}, {"name", name}}},
        {"registered_name", nullptr},
        {"name", name},
        {"inbound_nodes", Json::array()}};
  };
  auto layer = [](const char* cls, Json config, const char* name, Json args) {
    config["name"] = name;
    return Json{{"module", "keras.layers"},
                {"class_name", cls},
                {"config", config},
                {"registered_name", nullptr},
                {"name", name},
                {"inbound_nodes", {{{"args", args}, {"kwargs", Json::object()}}}}};
  };
  Json model = {
      {"module", "keras.src.models.functional"},
      {"class_name", "Functional"},
      {"registered_name", "Functional"},
      {"config",
       {{"name", "two_heads"},
        {"trainable", true},
        {"layers",
         {input("features", 3), layer("Dense", {{"units", 8}, {"activation", "relu"}}, "trunk", {kt("features", 3)}),
          input("extra", 1), layer("Concatenate", {{"axis", -1}}, "merge", {{kt("trunk", 8), kt("extra", 1)}}),
          layer("Dense", {{"units", 3}, {"activation", "softmax"}}, "digit", {kt("merge", 9)}),
          layer("Dense", {{"units", 1}, {"activation", "sigmoid"}}, "sign", {kt("merge", 9)})}},
        {"input_layers", {{"features", 0, 0}, {"extra", 0, 0}}},
        {"output_layers", {{"digit", 0, 0}, {"sign", 0, 0}}}}}};
  Json spec = Json::parse(R"({
    "data": {"source": "csv", "inputs": {"features": ["f0", "f1", "f2"], "extra": "e0"},
             "outputs": {"digit": "digit", "sign": {"column": "sign", "type": "float32"}}, "test_split": 0.2},
    "compile": {"optimizer": {"class_name": "Adam", "config": {"learning_rate": 0.05}},
                "loss": {"digit": "sparse_categorical_crossentropy", "sign": "binary_crossentropy"},
                "loss_weights": {"digit": 1.0, "sign": 0.5},
                "metrics": {"digit": ["accuracy"], "sign": ["accuracy"]}},
    "fit": {"epochs": 10, "batch_size": 16, "validation_split": 0.2, "seed": 3, "verbose": 2}
  })");
  spec["model"] = model;
  spec["data"]["path"] = dir_.path() + "/two.csv";
  spec["output"] = {{"base_dir", dir_.path() + "/two"}};
  const std::string spec_path = write_spec("two.json", spec);
  auto r = kiln("--threads 1 train " + q(spec_path));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* want : {"features (3,), extra (1,)", "digit_loss: ", "sign_loss: ", "digit_accuracy: ",
                           "val_sign_accuracy: ", "val_loss: ", "test_digit_loss: ", "test_sign_accuracy: "})
    EXPECT_NE(r.output.find(want), std::string::npos) << "'" << want << "' not in:\n" << r.output;
  // The test metrics: total = digit_loss + 0.5 * sign_loss; the easy digit task is learned.
  std::map<std::string, double> test;
  for (auto& line : lines_of(r.output))
    if (line.rfind("test_", 0) == 0)
      test[line.substr(5, line.find(':') - 5)] = std::stod(line.substr(line.find(':') + 1));
  ASSERT_TRUE(test.count("loss") && test.count("digit_loss") && test.count("sign_loss")) << r.output;
  EXPECT_NEAR(test["loss"], test["digit_loss"] + 0.5 * test["sign_loss"], 2e-4);
  EXPECT_GE(test["digit_accuracy"], 0.8) << r.output;

  // The saved model.json holds Keras's form and the per-output compile config.
  Json mj = read_json_file(dir_.path() + "/two/1/model.json");
  EXPECT_EQ(mj["config"]["layers"][1]["inbound_nodes"][0]["args"][0]["class_name"], "__keras_tensor__");
  EXPECT_EQ(mj["compile_config"]["loss_weights"]["sign"], 0.5);
  auto show = kiln("show " + q(dir_.path() + "/two/1"));
  ASSERT_EQ(show.exit_code, 0) << show.output;
  for (const char* want :
       {"loss: [digit: sparse_categorical_crossentropy", "loss_weights: {\"digit\":1.0,\"sign\":0.5}",
        "metrics: [digit: [accuracy = SparseCategoricalAccuracy], sign: [accuracy = BinaryAccuracy"})
    EXPECT_NE(show.output.find(want), std::string::npos) << "'" << want << "' not in:\n" << show.output;
  auto ev = kiln("--threads 1 evaluate " + q(dir_.path() + "/two/1") + " --spec " + q(spec_path) + " --json");
  ASSERT_EQ(ev.exit_code, 0) << ev.output;
  Json ej = Json::parse(lines_of(ev.output).back());
  EXPECT_NEAR(ej["digit_loss"].get<double>(), test["digit_loss"], 1e-3);
  EXPECT_NEAR(ej["sign_accuracy"].get<double>(), test["sign_accuracy"], 1e-3);

  // A name the model does not have is one clear line.
  spec["data"]["outputs"] = Json::parse(R"({"digit": "digit", "sgn": "sign"})");
  expect_user_error("train " + q(write_spec("bad.json", spec)),
                    {"the model's output 'sign' has no data", "digit, sgn"});
}

}  // namespace
}  // namespace kiln
