// The loader's contract without a real model: a servable platform that
// counts its live instances shows what a failed load keeps (nothing) and
// what unload frees (everything), and the error names the directory.
#include "kiln/serving/core/loader.h"

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>

#include "kiln/testing/testing.h"

namespace kiln::serving {
namespace {

std::atomic<int> g_loader_test_live{0};

class LoaderTestServable : public Servable {
 public:
  LoaderTestServable() { ++g_loader_test_live; }
  ~LoaderTestServable() override { --g_loader_test_live; }
  TensorMap predict(const TensorMap& inputs, const std::string&) override { return inputs; }
  const Json& signatures() const override { return signatures_; }
  int64_t memory_bytes() const override { return 4096; }

 private:
  Json signatures_ = Json::parse(
      R"({"serving_default": {"inputs": {"x": {"dtype": "float32", "shape": [-1, 2]}},
          "outputs": {"x": {"dtype": "float32", "shape": [-1, 2]}}, "method_name": "predict"}})");
};

void register_loader_test_platforms() {
  static const bool once = [] {
    register_servable_factory("loader_test_counting",
                              [](const std::string&) { return std::make_unique<LoaderTestServable>(); });
    register_servable_factory("loader_test_broken", [](const std::string&) -> std::unique_ptr<Servable> {
      throw FormatError("model.json is truncated");
    });
    return true;
  }();
  (void)once;
}

LoaderOptions loader_options(const std::string& platform, const std::string& dir) {
  LoaderOptions o;
  o.model = "m";
  o.version = 3;
  o.platform = platform;
  o.dir = dir;
  return o;
}

bool has_line(const MetricsRegistry& metrics, const std::string& line) {
  return metrics.expose().find(line) != std::string::npos;
}

TEST(VersionLoader, LoadsAndRecordsTheResourceEstimateAndLoadTime) {
  register_loader_test_platforms();
  TempDir dir;
  MetricsRegistry metrics;
  VersionLoader loader(loader_options("loader_test_counting", dir.path()), metrics);
  std::shared_ptr<Servable> s = loader.load();
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(g_loader_test_live.load(), 1);
  EXPECT_TRUE(has_line(metrics, "kiln_model_memory_bytes{model=\"m\",version=\"3\"} 4096"));
  // A servable that does not say otherwise computes on the CPU, all its bytes there.
  EXPECT_TRUE(has_line(metrics, "kiln_model_device_memory_bytes{device=\"cpu\",model=\"m\",version=\"3\"} 4096"));
  EXPECT_TRUE(has_line(metrics, "kiln_model_load_seconds_count{model=\"m\"} 1"));
  loader.unload(std::move(s));
}

TEST(VersionLoader, UnloadDestroysTheServableAndZeroesTheGauge) {
  register_loader_test_platforms();
  TempDir dir;
  MetricsRegistry metrics;
  VersionLoader loader(loader_options("loader_test_counting", dir.path()), metrics);
  std::shared_ptr<Servable> s = loader.load();
  std::weak_ptr<Servable> watch = s;
  loader.unload(std::move(s));
  EXPECT_TRUE(watch.expired());
  EXPECT_EQ(g_loader_test_live.load(), 0);
  EXPECT_TRUE(has_line(metrics, "kiln_model_memory_bytes{model=\"m\",version=\"3\"} 0"));
  EXPECT_FALSE(has_line(metrics, "kiln_model_device_memory_bytes")) << "an unloaded version is on no device";
}

TEST(VersionLoader, AFactoryErrorNamesTheDirectoryAndIsCounted) {
  register_loader_test_platforms();
  TempDir dir;
  MetricsRegistry metrics;
  VersionLoader loader(loader_options("loader_test_broken", dir.path()), metrics);
  try {
    loader.load();
    FAIL() << "expected LoadError";
  } catch (const LoadError& e) {
    EXPECT_EQ(std::string(e.what()), dir.path() + ": model.json is truncated");
  }
  EXPECT_TRUE(has_line(metrics, "kiln_model_load_failures_total{model=\"m\"} 1"));
  EXPECT_FALSE(has_line(metrics, "kiln_model_memory_bytes")) << "nothing registered for a failed load";
  EXPECT_FALSE(has_line(metrics, "kiln_model_device_memory_bytes"));
  EXPECT_FALSE(has_line(metrics, "kiln_model_load_seconds_count"));
}

TEST(VersionLoader, AFailedWarmupDestroysTheHalfLoadedServable) {
  register_loader_test_platforms();
  TempDir dir;
  std::filesystem::create_directories(dir.path() + "/assets/extra");
  std::ofstream(dir.path() + "/assets/extra/warmup_requests.jsonl") << "{\"instances\": [[1, 2]]}\nnot json\n";
  MetricsRegistry metrics;
  VersionLoader loader(loader_options("loader_test_counting", dir.path()), metrics);
  try {
    loader.load();
    FAIL() << "expected LoadError";
  } catch (const LoadError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(dir.path() + "/assets/extra/warmup_requests.jsonl:2"), std::string::npos) << msg;
    EXPECT_EQ(msg.find(dir.path() + ": "), std::string::npos) << "the cause already names the directory: " << msg;
  }
  EXPECT_EQ(g_loader_test_live.load(), 0);
  EXPECT_FALSE(has_line(metrics, "kiln_model_memory_bytes"));
  EXPECT_FALSE(has_line(metrics, "kiln_warmup_requests_total"));
}

TEST(VersionLoader, WarmupOffSkipsTheWarmupFile) {
  register_loader_test_platforms();
  TempDir dir;
  std::filesystem::create_directories(dir.path() + "/assets/extra");
  std::ofstream(dir.path() + "/assets/extra/warmup_requests.jsonl") << "not json\n";
  MetricsRegistry metrics;
  LoaderOptions o = loader_options("loader_test_counting", dir.path());
  o.enable_warmup = false;
  VersionLoader loader(o, metrics);
  loader.unload(loader.load());
  EXPECT_EQ(g_loader_test_live.load(), 0);
}

TEST(MetricsRegistry, RemoveDropsOneSeriesAndAnEmptyFamily) {
  MetricsRegistry metrics;
  metrics.gauge("g", "help", {{"v", "1"}}).set(3);
  metrics.gauge("g", "help", {{"v", "2"}}).set(4);
  EXPECT_TRUE(metrics.remove("g", {{"v", "1"}}));
  EXPECT_FALSE(has_line(metrics, "g{v=\"1\"}"));
  EXPECT_TRUE(has_line(metrics, "g{v=\"2\"} 4"));
  EXPECT_FALSE(metrics.remove("g", {{"v", "1"}})) << "already gone";
  EXPECT_FALSE(metrics.remove("nope", {}));
  EXPECT_TRUE(metrics.remove("g", {{"v", "2"}}));
  EXPECT_FALSE(has_line(metrics, "# HELP g ")) << "no family without series";
  metrics.gauge("g", "help", {{"v", "1"}}).add(1);
  EXPECT_TRUE(has_line(metrics, "g{v=\"1\"} 1")) << "made anew from zero";
}

}  // namespace
}  // namespace kiln::serving
