// The browser page (web/classifier: onnxruntime-web in headless Chromium)
// shows the labels `kiln predict` gives: trains the Fashion-MNIST MLP of
// examples/fashion_mnist_mlp.json for one epoch with the CLI, exports it to
// ONNX, takes 16 real test images (web/classifier/make_samples.js), runs the
// page (web/classifier/test/browser_check.js: loopback server, playwright-core
// driving Debian's chromium) and compares its labels and probabilities with
// `kiln predict` on the same images, and on an image drawn on the page's pad.
// Skips with a message when node, chromium, the npm packages or the data are
// missing. The screenshot goes to the test's working directory (the build
// folder), and to docs/images/ with KILN_UPDATE_SCREENSHOTS=1.
//
// The page's second model, a text classifier exported with its string
// preprocessing (string input -> TextVectorization -> Embedding -> ...):
// sentences typed into the page's text box get the classes and
// probabilities kiln gives them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "kiln/core/io.h"
#include "kiln/core/json.h"
#include "kiln/data/datasets.h"
#include "kiln/data/readers.h"
#include "kiln/testing/testing.h"

namespace kiln {
namespace exporter {

// The page's text classifier as a user makes it: `kiln train
// examples/text_classifier.json` (raw sentences of datasets::text_topics),
// `kiln export --format onnx` to `onnx_path`, and `kiln predict` on
// `sentences` given as JSON strings: kiln's probabilities (one row each) and
// the class names. `work` is a scratch folder. (In export_test.cc.)
std::vector<std::vector<float>> train_and_export_text_classifier(const std::string& work, const std::string& onnx_path,
                                                                 const std::vector<std::string>& sentences,
                                                                 std::vector<std::string>* class_names);

}  // namespace exporter
namespace {

std::string q(const std::string& s) { return "'" + s + "'"; }

std::string chromium_path() {
  const char* p = std::getenv("KILN_CHROMIUM");
  return p && *p ? p : "/usr/bin/chromium";
}

// Why the page cannot be checked here, or "". Installs the npm packages
// (`npm ci --ignore-scripts`, offline from ../shared/npm-cache where it is
// there, as scripts/setup.sh does) when they are missing.
std::string browser_check_missing(bool fashion_mnist = true) {
  if (fashion_mnist && !have_fashion_mnist())
    return "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)";
  if (run_command("command -v node >/dev/null").exit_code != 0)
    return "node is not installed (Debian: apt-get install nodejs npm)";
  if (run_command("test -x " + q(chromium_path())).exit_code != 0)
    return chromium_path() + " is not there (Debian: apt-get install chromium, or set KILN_CHROMIUM)";
  const std::string dir = source_path("web/classifier");
  if (path_exists(dir + "/node_modules/onnxruntime-web/package.json") &&
      path_exists(dir + "/node_modules/playwright-core/package.json"))
    return "";
  // As scripts/setup.sh: from the offline cache beside the project when it
  // is there (the npm registry may be unreachable), else from the registry.
  const char* env_cache = std::getenv("KILN_NPM_CACHE");
  const std::string cache = env_cache && *env_cache ? env_cache : source_path("../shared/npm-cache");
  if (path_exists(cache) && run_command("cd " + q(dir) + " && npm ci --offline --cache " + q(cache) +
                                        " --ignore-scripts --no-audit --no-fund")
                                    .exit_code == 0)
    return "";
  auto r = run_command("cd " + q(dir) + " && npm ci --ignore-scripts --no-audit --no-fund --fetch-retries=1");
  if (r.exit_code != 0)
    return "`npm ci --ignore-scripts` in web/classifier failed (no registry, and no offline cache at " + cache +
           "; set KILN_NPM_CACHE): " + r.output.substr(0, 300);
  return "";
}

CommandResult run_kiln(const std::string& args) { return run_command(q(cli_path()) + " " + args); }

// A pixel byte as the page feeds it: the byte times 1/255, as float32.
float scaled(int byte) { return static_cast<float>(byte * (1.0 / 255.0)); }

// `kiln predict` on images of 784 bytes each: one probability row per image.
std::vector<std::vector<float>> kiln_predict(const std::string& model, const std::vector<std::vector<int>>& images,
                                             const std::string& work) {
  std::string lines;
  for (auto& pixels : images) {
    Json row = Json::array();
    for (int p : pixels) row.push_back(scaled(p));
    lines += row.dump() + "\n";
  }
  atomic_write_file(work + "/instances.jsonl", lines);
  auto r = run_kiln("predict " + q(model) + " --input " + q(work + "/instances.jsonl") + " --output " +
                    q(work + "/predictions.jsonl"));
  if (r.exit_code != 0) throw std::runtime_error("kiln predict: " + r.output);
  std::vector<std::vector<float>> out;
  std::istringstream in(read_file(work + "/predictions.jsonl"));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(Json::parse(line).at("predictions").get<std::vector<float>>());
  return out;
}

int64_t argmax(const std::vector<float>& row) { return std::max_element(row.begin(), row.end()) - row.begin(); }

// Runs the page on the files in `www` in headless Chromium
// (web/classifier/test/browser_check.js, bounded: the driver has its own
// watchdog too) and returns what it shows; `extra`: more driver options.
Json run_page(const std::string& www, const std::string& work, const std::string& screenshot,
              const std::vector<std::string>& extra = {}) {
  const std::string node = run_command("command -v node").output;
  std::vector<std::string> argv = {node.substr(0, node.find('\n')),
                                   source_path("web/classifier/test/browser_check.js"),
                                   "--data",
                                   www,
                                   "--output",
                                   work + "/page.json",
                                   "--screenshot",
                                   screenshot,
                                   "--chromium",
                                   chromium_path(),
                                   "--timeout_ms",
                                   "30000"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  pid_t pid = spawn_logged(argv, work + "/browser.log");
  if (pid <= 0) throw std::runtime_error("could not start node");
  const int status = wait_bounded(pid, 60);
  if (status != 0)
    throw std::runtime_error(std::string("browser_check.js ") + (status < 0 ? "ran past 60 s" : "failed") + ":\n" +
                             read_file(work + "/browser.log"));
  return Json::parse(read_file(work + "/page.json"));
}

// A copy of the page's screenshot beside the test binary (ctest runs in the
// build folder) to look at, and in docs/images/ with KILN_UPDATE_SCREENSHOTS=1.
void keep_screenshot(const std::string& screenshot, const std::string& name) {
  ASSERT_TRUE(path_exists(screenshot));
  atomic_write_file(name, read_file(screenshot));
  const char* update = std::getenv("KILN_UPDATE_SCREENSHOTS");
  if (update && std::string(update) == "1") {
    make_dirs(source_path("docs/images"));
    atomic_write_file(source_path("docs/images/" + name), read_file(screenshot));
  }
}

TEST(BrowserClassifier, PageShowsTheLabelsOfKilnPredict) {
  KILN_SKIP_WITHOUT_CLI();
  auto why = browser_check_missing();
  if (!why.empty()) KILN_SKIP_OR_FAIL("browser classifier check skipped: " << why);
  TempDir dir;
  const std::string www = dir.path() + "/www", model = dir.path() + "/models/1";
  make_dirs(www);

  // The example spec's model, one epoch, exported.
  auto t = run_kiln("train " + q(source_path("examples/fashion_mnist_mlp.json")) + " --epochs 1 --output " +
                    q(dir.path() + "/models"));
  ASSERT_EQ(t.exit_code, 0) << t.output;
  auto e = run_kiln("export --format onnx --model " + q(model) + " --output " + q(www + "/model.onnx"));
  ASSERT_EQ(e.exit_code, 0) << e.output;

  // 16 test images, checked against the IDX file kiln reads.
  auto m = run_command("node " + q(source_path("web/classifier/make_samples.js")) + " --count 16 --output " +
                       q(www + "/samples.json"));
  ASSERT_EQ(m.exit_code, 0) << m.output;
  Json samples = Json::parse(read_file(www + "/samples.json")).at("images");
  ASSERT_EQ(samples.size(), 16u);
  const std::string fm = datasets::fashion_mnist_directory();
  const std::string images_file = path_exists(fm + "/t10k-images-idx3-ubyte.gz") ? fm + "/t10k-images-idx3-ubyte.gz"
                                                                                 : fm + "/t10k-images-idx3-ubyte";
  at::Tensor test_images = data::read_idx(images_file).to(at::kInt);
  std::vector<std::vector<int>> images;
  for (auto& s : samples) {
    images.push_back(s.at("pixels").get<std::vector<int>>());
    at::Tensor want = test_images[s.at("index").get<int64_t>()].flatten();
    ASSERT_TRUE(at::equal(at::tensor(images.back(), at::kInt), want)) << "test image #" << s.at("index");
  }
  auto want = kiln_predict(model, images, dir.path());
  ASSERT_EQ(want.size(), images.size());

  // The page, in headless Chromium.
  const std::string screenshot = dir.path() + "/browser_classifier.png";
  Json page = run_page(www, dir.path(), screenshot);

  const auto& names = datasets::fashion_mnist_class_names();
  ASSERT_EQ(page.at("samples").size(), samples.size()) << page.dump();
  int correct = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    const Json& shown = page["samples"][i];
    const int64_t cls = argmax(want[i]);
    SCOPED_TRACE("test image #" + std::to_string(samples[i].at("index").get<int64_t>()));
    EXPECT_EQ(shown.at("index"), samples[i].at("index"));
    EXPECT_EQ(shown.at("predicted_class").get<int64_t>(), cls);
    EXPECT_EQ(shown.at("predicted_label").get<std::string>(), names[cls]);
    EXPECT_NEAR(shown.at("probability").get<double>(), want[i][cls], 1e-4);
    correct += cls == samples[i].at("label").get<int64_t>();
  }
  // The page's 1/255 is the spec's: a one-epoch MLP gets most of them right.
  EXPECT_GE(correct, 11) << "of 16";

  // The pad: a test image with a stroke drawn over it by the mouse.
  const Json& drawn = page.at("drawn");
  auto pixels = drawn.at("pixels").get<std::vector<int>>();
  ASSERT_EQ(pixels.size(), 784u);
  EXPECT_NE(pixels, images[0]) << "the stroke did not change the pad";
  auto want_drawn = kiln_predict(model, {pixels}, dir.path());
  const int64_t cls = argmax(want_drawn.at(0));
  EXPECT_EQ(drawn.at("predicted_class").get<int64_t>(), cls);
  EXPECT_EQ(drawn.at("predicted_label").get<std::string>(), names[cls]);
  EXPECT_NEAR(drawn.at("probability").get<double>(), want_drawn[0][cls], 1e-4);

  keep_screenshot(screenshot, "browser_classifier.png");
}

TEST(BrowserClassifier, PageClassifiesTypedSentencesAsKilnDoes) {
  KILN_SKIP_WITHOUT_CLI();
  auto why = browser_check_missing(/*fashion_mnist=*/false);
  if (!why.empty()) KILN_SKIP_OR_FAIL("browser classifier check skipped: " << why);
  TempDir dir;
  const std::string www = dir.path() + "/www";
  make_dirs(www);
  // Sentences of each topic, an empty one, one with words the model never
  // saw, one in upper case, one with runs of spaces and a tab.
  const std::vector<std::string> sentences = {"the team scored a late goal to win the match",
                                              "stir the sauce and bake the bread until golden",
                                              "the laptop needs a faster processor and more memory",
                                              "heavy rain and strong wind are expected tomorrow",
                                              "",
                                              "zebras quietly juggle turquoise harmonicas",
                                              "THE STRIKER KICKED THE BALL",
                                              "  snow   and  cold \t wind  "};
  std::vector<std::string> names;
  const auto want = exporter::train_and_export_text_classifier(dir.path(), www + "/text_model.onnx", sentences, &names);
  ASSERT_EQ(want.size(), sentences.size());
  atomic_write_file(www + "/text_labels.json", Json{{"class_names", names}}.dump());
  atomic_write_file(dir.path() + "/texts.json", Json(sentences).dump());

  const std::string screenshot = dir.path() + "/browser_text_classifier.png";
  Json page = run_page(www, dir.path(), screenshot, {"--texts", dir.path() + "/texts.json"});
  ASSERT_EQ(page.at("texts").size(), sentences.size()) << page.dump();
  EXPECT_FALSE(page.contains("samples")) << "no image model was given";
  for (size_t i = 0; i < sentences.size(); ++i) {
    const Json& shown = page["texts"][i];
    const int64_t cls = argmax(want[i]);
    SCOPED_TRACE("sentence \"" + sentences[i] + "\"");
    EXPECT_EQ(shown.at("text").get<std::string>(), sentences[i]);
    EXPECT_EQ(shown.at("predicted_class").get<int64_t>(), cls);
    EXPECT_EQ(shown.at("predicted_label").get<std::string>(), names.at(cls));
    EXPECT_NEAR(shown.at("probability").get<double>(), want[i][cls], 1e-4);
  }
  // A model that learned the topics: the four plain sentences get their own.
  for (int64_t k = 0; k < 4; ++k) EXPECT_EQ(page["texts"][k].at("predicted_class").get<int64_t>(), k);
  keep_screenshot(screenshot, "browser_text_classifier.png");
}

}  // namespace
}  // namespace kiln
