#include <gtest/gtest.h>

#include <iostream>

#include <malloc.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include "kiln/serving/api/tfs_v1.h"
#include "kiln/serving/serving_test_util.h"
#include "kiln/testing/testing.h"

namespace kiln::serving {
namespace {

using namespace kiln::serving::testing;

bool wait_for(const std::function<bool()>& cond, double seconds = 30) {
  auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  while (!cond()) {
    if (Clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling a condition with a deadline
  }
  return true;
}

VersionState state_of(ServerCore& core, const std::string& m, int64_t v) {
  try {
    auto s = core.model_status({m, v, std::nullopt});
    return s.at(0).state;
  } catch (const ServingError&) {
    return VersionState::kNew;
  }
}

TEST(ServerCore, NewVersionsReplaceOldOnesUnderLoadWithZeroFailures) {
  TempDir dir;
  std::string base = dir.path() + "/m";
  save_tiny_model(base + "/1", 0.5f);
  ServerCoreOptions o;
  o.config.models = {model_config("m", base)};
  o.file_system_poll_wait_seconds = 0.02;
  Served s(o);
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, failed{0};
  std::string body = R"({"instances": [[1,1,1,1]]})";
  std::vector<std::thread> clients;
  std::mutex seen_mu;
  std::set<float> seen;
  for (int i = 0; i < 4; ++i)
    clients.emplace_back([&] {
      auto c = s.client();
      while (!stop) {
        auto r = c->Post("/v1/models/m:predict", body, "application/json");
        if (r && r->status == 200) {
          ++ok;
          float v = Json::parse(r->body)["predictions"][0][0].get<float>();
          std::lock_guard<std::mutex> l(seen_mu);
          seen.insert(v);
        } else {
          ++failed;
        }
      }
    });
  // A half-written version (no model.json yet, temp name) is ignored.
  make_dirs(base + "/.tmp-2");
  make_dirs(base + "/3");
  // Version 2 appears (atomically, as Model::save writes it): it takes over.
  save_tiny_model(base + "/2", 1.0f);
  ASSERT_TRUE(wait_for([&] { return state_of(*s.core, "m", 1) == VersionState::kDisabled; }));
  EXPECT_EQ(state_of(*s.core, "m", 2), VersionState::kReady);
  // Rollback: removing version 2 brings version 1 back.
  std::filesystem::remove_all(base + "/2");
  ASSERT_TRUE(wait_for([&] {
    return state_of(*s.core, "m", 2) == VersionState::kDisabled && state_of(*s.core, "m", 1) == VersionState::kReady;
  }));
  int before = ok;
  ASSERT_TRUE(wait_for([&] { return ok > before + 20; }));
  stop = true;
  for (auto& t : clients) t.join();
  EXPECT_EQ(failed, 0);
  EXPECT_GT(ok, 0);
  EXPECT_TRUE(seen.count(tiny_output(0.5f, {1, 1, 1, 1})));
  EXPECT_TRUE(seen.count(tiny_output(1.0f, {1, 1, 1, 1})));
  Json st = tfs_v1::status_json(s.core->model_status({"m"}));
  EXPECT_EQ(st["model_version_status"][0]["version"], "2");
  EXPECT_EQ(st["model_version_status"][0]["state"], "END");
}

TEST(ServerCore, AFailedLoadIsReportedAndDoesNotReplaceTheWorkingVersion) {
  TempDir dir;
  std::string base = dir.path() + "/m";
  save_tiny_model(base + "/1", 0.5f);
  ServerCoreOptions o;
  o.config.models = {model_config("m", base)};
  o.file_system_poll_wait_seconds = 0;
  Served s(o);
  make_dirs(base + "/2");
  {
    std::ofstream f(base + "/2/model.json");
    f << "{\"format\": \"kiln.model\", \"class_name\": ";  // damaged
  }
  s.core->poll_now();
  ASSERT_TRUE(s.core->wait_until_idle(30));
  EXPECT_EQ(state_of(*s.core, "m", 2), VersionState::kError);
  EXPECT_EQ(state_of(*s.core, "m", 1), VersionState::kReady);
  Json st = tfs_v1::status_json(s.core->model_status({"m", 2, std::nullopt}));
  EXPECT_EQ(st["model_version_status"][0]["state"], "END");
  EXPECT_EQ(st["model_version_status"][0]["status"]["error_code"], "UNKNOWN");
  EXPECT_FALSE(st["model_version_status"][0]["status"]["error_message"].get<std::string>().empty());
  EXPECT_EQ(s.core->get({"m"})->version, 1);  // the handle is released at once
  auto r = s.client()->Post("/v1/models/m:predict", R"({"instances": [[1,1,1,1]]})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  // Fixed on disk: retried and served.
  std::filesystem::remove_all(base + "/2");
  save_tiny_model(base + "/2", 1.0f);
  s.core->poll_now();
  ASSERT_TRUE(s.core->wait_until_ready({"m", 2, std::nullopt}, 30));
  ASSERT_TRUE(s.core->wait_until_idle(30));
  EXPECT_EQ(state_of(*s.core, "m", 1), VersionState::kDisabled);
}

// kiln_model_device_memory_bytes on the CPU: the model's weight bytes with
// device="cpu", on the server's Prometheus page, gone once the version unloads.
TEST(ServerCore, DeviceMemoryGaugeReportsTheWeightsAndGoesWithTheVersion) {
  TempDir dir;
  std::string base = dir.path() + "/m";
  ModelPtr model = save_tiny_model(base + "/1", 0.5f);
  int64_t weight_bytes = 0;
  for (auto& w : model->weights()) weight_bytes += (int64_t)w->value().nbytes();
  ASSERT_EQ(weight_bytes, (4 * 3 + 3) * 4);  // Dense(3) on 4 inputs, float32
  ServerCoreOptions o;
  o.config.models = {model_config("m", base)};
  o.file_system_poll_wait_seconds = 0;
  Served s(o);
  const std::string series = "kiln_model_device_memory_bytes{device=\"cpu\",model=\"m\",version=\"1\"} ";
  auto page = [&] {
    auto r = s.client()->Get("/monitoring/prometheus/metrics");
    EXPECT_TRUE(r && r->status == 200);
    return r ? r->body : std::string();
  };
  std::string body = page();
  EXPECT_NE(body.find(series + std::to_string(weight_bytes) + "\n"), std::string::npos) << body;
  EXPECT_NE(body.find("# TYPE kiln_model_device_memory_bytes gauge"), std::string::npos);
  s.core->unload_model("m");
  ASSERT_TRUE(s.core->wait_until_idle(30));
  body = page();
  EXPECT_EQ(body.find("kiln_model_device_memory_bytes"), std::string::npos) << body;
}

// TF Serving users' complaint "memory kept after unload": a version's
// memory goes back to the system when it unloads, so swaps do not pile up.
// Without malloc_trim after unload, glibc kept freed weights in its heap:
// 178 MB with nothing loaded, 550 MB after six versions of a 40 MB model
// (one loaded at a time); with it, 220 MB. What the first swaps cost once
// (the server's threads and their heaps, LibTorch's and MKL's first-use
// buffers: 58-91 MB on LibTorch 2.11 with MKL, 42 MB on 1.13 with OpenBLAS)
// is not a version's memory, so the growth is measured from the state after
// the first swap, and the whole against a looser bound.
TEST(ServerCore, MemoryIsReturnedWhenVersionsUnload) {
  if (KILN_UNDER_ASAN) GTEST_SKIP() << "measures glibc's heap; AddressSanitizer's allocator keeps freed memory";
  TempDir dir;
  std::string base = dir.path() + "/m";
  auto save = [&](int64_t v) {
    auto m = models::Sequential();  // the serving benchmark's larger MLP: 40 MB of float32 weights
    m->add(layers::Input({784}));
    for (int i = 0; i < 3; ++i) m->add(layers::Dense(2048));
    m->add(layers::Dense(10));
    m->save(base + "/" + std::to_string(v));
  };
  save(1);
  malloc_trim(0);
  const int64_t before = process_rss_bytes();  // nothing loaded
  ServerCoreOptions o;
  o.config.models = {model_config("m", base)};  // latest 1: each new version unloads the previous
  o.file_system_poll_wait_seconds = 0;
  ServerCore core(o);
  core.start();
  ASSERT_TRUE(core.wait_until_ready({"m", 1, std::nullopt}, 60));
  int64_t after_first_swap = 0;
  for (int64_t v = 2; v <= 7; ++v) {
    save(v);
    core.poll_now();
    ASSERT_TRUE(core.wait_until_ready({"m", v, std::nullopt}, 60));
    ASSERT_TRUE(core.wait_until_idle(60));
    ASSERT_EQ(state_of(core, "m", v - 1), VersionState::kDisabled);
    if (v == 2) after_first_swap = process_rss_bytes();
  }
  const int64_t model_bytes = (785 * 2048 + 2 * 2049 * 2048 + 2049 * 10) * 4;
  const int64_t now = process_rss_bytes();
  const int64_t grown = now - after_first_swap, held = now - before;
  std::cout << "[ measured ] " << model_bytes / 1000000 << " MB model: held " << held / 1000000
            << " MB over none loaded, grown " << grown / 1000000 << " MB over 5 more swaps" << std::endl;
  // Keeping unloaded versions grows the process by a model per swap (5 x 42
  // MB here); glibc's per-thread arenas alone grew it by up to 33 MB on a
  // loaded 2-core machine, so the bound is one model.
  EXPECT_LT(grown, model_bytes) << "5 more swaps of a " << model_bytes / 1000000 << " MB model grew the process by "
                                << grown / 1000000 << " MB: unloaded versions' memory is kept";
  EXPECT_LT(held, 3 * model_bytes) << "after 6 swaps of a " << model_bytes / 1000000 << " MB model the process holds "
                                   << held / 1000000 << " MB more than with none loaded";
}

// Wraps the kiln servable; records the state its version was in at each predict.
struct Spy {
  static ServerCore*& core() {
    static ServerCore* c = nullptr;
    return c;
  }
  static std::vector<VersionState>& states() {
    static std::vector<VersionState> s;
    return s;
  }
};
class SpyServable : public Servable {
 public:
  explicit SpyServable(const std::string& dir) : inner_(dir) {}
  TensorMap predict(const TensorMap& in, const std::string& sig) override {
    if (Spy::core()) Spy::states().push_back(state_of(*Spy::core(), "w", 1));
    return inner_.predict(in, sig);
  }
  const Json& signatures() const override { return inner_.signatures(); }
  int64_t memory_bytes() const override { return inner_.memory_bytes(); }

 private:
  ModelServable inner_;
};

TEST(ServerCore, WarmupRequestsAreReplayedBeforeTheVersionIsAvailable) {
  register_servable_factory("spy", [](const std::string& d) { return std::make_unique<SpyServable>(d); });
  TempDir dir;
  std::string base = dir.path() + "/w";
  save_tiny_model(base + "/1", 0.5f);
  ServerCoreOptions o;
  ModelConfig m = model_config("w", base);
  m.model_platform = "spy";
  o.file_system_poll_wait_seconds = 0;
  ServerCore core(o);
  Spy::core() = &core;
  Spy::states().clear();
  make_dirs(base + "/1/assets/extra");
  {
    std::ofstream f(base + "/1/assets/extra/warmup_requests.jsonl");
    f << R"({"instances": [[1,2,3,4]]})"
      << "\n\n"
      << R"({"inputs": [[1,2,3,4],[5,6,7,8]]})"
      << "\n";
  }
  core.start();
  core.load_model(m);
  ASSERT_TRUE(core.wait_until_ready({"w"}, 30));
  ASSERT_EQ(Spy::states().size(), 2u);
  for (auto s : Spy::states()) EXPECT_EQ(s, VersionState::kLoading);
  EXPECT_NE(core.metrics().expose().find("kiln_warmup_requests_total{model=\"w\"} 2"), std::string::npos);
  // A failing warmup request fails the load.
  save_tiny_model(base + "/2", 1.0f);
  make_dirs(base + "/2/assets/extra");
  {
    std::ofstream f(base + "/2/assets/extra/warmup_requests.jsonl");
    f << R"({"instances": [[1,2]]})"
      << "\n";
  }
  core.poll_now();
  ASSERT_TRUE(core.wait_until_idle(30));
  auto st = core.model_status({"w", 2, std::nullopt});
  EXPECT_EQ(st[0].state, VersionState::kError);
  EXPECT_NE(st[0].error.find("warmup"), std::string::npos);
  EXPECT_EQ(core.get({"w"})->version, 1);
  Spy::core() = nullptr;
}

TEST(ServerCore, ConfigReloadAddsAndRemovesModelsAndLabels) {
  TempDir dir;
  save_tiny_model(dir.path() + "/a/1", 0.5f);
  save_tiny_model(dir.path() + "/b/1", 1.0f);
  save_tiny_model(dir.path() + "/b/2", 2.0f);
  ServerCoreOptions o;
  o.config.models = {model_config("a", dir.path() + "/a")};
  o.file_system_poll_wait_seconds = 0;
  ServerCore core(o);
  core.start();
  EXPECT_TRUE(core.is_ready({"a"}));
  auto cfg = parse_model_config("model_config_list { config { name: \"b\" base_path: \"" + dir.path() +
                                "/b\" model_version_policy { specific { versions: 1 versions: 2 } } "
                                "version_labels { key: \"stable\" value: 1 } } }");
  core.reload_config(cfg);
  ASSERT_TRUE(core.wait_until_idle(30));
  EXPECT_EQ(core.model_names(), (std::vector<std::string>{"b"}));
  try {
    core.get({"a"});
    ADD_FAILURE();
  } catch (const ServingError& e) {
    EXPECT_EQ(e.code(), Code::kNotFound);
  }
  EXPECT_EQ(core.get({"b", std::nullopt, "stable"})->version, 1);
  EXPECT_EQ(core.get({"b"})->version, 2);
  core.unload_model("b");
  ASSERT_TRUE(core.wait_until_idle(30));
  EXPECT_TRUE(core.model_names().empty());
}

TEST(ServerCore, AHandleKeepsAQuiescingVersionAliveUntilReleased) {
  TempDir dir;
  std::string base = dir.path() + "/m";
  save_tiny_model(base + "/1", 0.5f);
  ServerCoreOptions o;
  o.config.models = {model_config("m", base)};
  o.file_system_poll_wait_seconds = 0;
  ServerCore core(o);
  core.start();
  auto h = core.get({"m"});
  save_tiny_model(base + "/2", 1.0f);
  core.poll_now();
  ASSERT_TRUE(core.wait_until_ready({"m", 2, std::nullopt}, 30));
  ASSERT_TRUE(wait_for([&] { return state_of(core, "m", 1) == VersionState::kQuiescing; }));
  // The old version still computes for the request that holds it.
  auto x = at::ones({1, 4});
  auto out = core.predict(*h, "", {{input_name(*h), x}});
  EXPECT_FLOAT_EQ(out.begin()->second[0][0].item<float>(), tiny_output(0.5f, {1, 1, 1, 1}));
  EXPECT_EQ(state_of(core, "m", 1), VersionState::kQuiescing);
  h.reset();
  ASSERT_TRUE(wait_for([&] { return state_of(core, "m", 1) == VersionState::kDisabled; }));
}

TEST(ServerCore, BatchingThroughTheRestApiSplitsOversizeRequestsAndHonoursDeadlines) {
  TempDir dir;
  std::string base = dir.path() + "/m";
  save_tiny_model(base + "/1", 1.0f);
  ServerCoreOptions o;
  o.config.models = {model_config("m", base)};
  o.file_system_poll_wait_seconds = 0;
  o.enable_batching = true;
  o.batching.max_batch_size = 4;
  o.batching.batch_timeout_micros = 0;
  Served s(o);
  auto c = s.client();
  // 10 rows with max_batch_size 4: split, not rejected.
  std::string body = R"({"instances": [)";
  for (int i = 0; i < 10; ++i) body += std::string(i ? "," : "") + "[" + std::to_string(i) + ",0,0,0]";
  body += "]}";
  auto r = c->Post("/v1/models/m:predict", body, "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  Json j = Json::parse(r->body);
  ASSERT_EQ(j["predictions"].size(), 10u);
  for (int i = 0; i < 10; ++i) EXPECT_FLOAT_EQ(j["predictions"][i][0].get<float>(), tiny_output(1.0f, {(float)i}));
  // A deadline already spent: 504.
  httplib::Headers hd{{"X-Request-Timeout-Ms", "0"}};
  r = c->Post("/v1/models/m:predict", hd, R"({"instances": [[1,1,1,1]]})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 504);
  EXPECT_NE(s.core->metrics().expose().find("kiln_batch_size_bucket"), std::string::npos);
}

// One predict_async answer: how often and on which thread `done` ran.
struct AsyncAnswer {
  std::mutex mu;
  std::condition_variable cv;
  int calls = 0;  // guarded by mu (and the rest)
  std::thread::id thread;
  std::exception_ptr error;
  TensorMap outputs;
  RequestTiming timing;
  ServerCore::PredictDone fn() {
    return [this](std::exception_ptr e, TensorMap out, const RequestTiming& t) {
      std::lock_guard<std::mutex> l(mu);
      ++calls;
      thread = std::this_thread::get_id();
      error = e;
      outputs = std::move(out);
      timing = t;
      cv.notify_all();
    };
  }
  bool wait() {  // a guard against a hang, not a timing
    std::unique_lock<std::mutex> l(mu);
    return cv.wait_for(l, std::chrono::seconds(30), [&] { return calls > 0; });
  }
  int count() {
    std::lock_guard<std::mutex> l(mu);
    return calls;
  }
  Code code() {
    std::lock_guard<std::mutex> l(mu);
    if (!error) return Code::kOk;
    try {
      std::rethrow_exception(error);
    } catch (...) {
      return status_of_current_exception().code;
    }
  }
  float first_output() {
    std::lock_guard<std::mutex> l(mu);
    return outputs.begin()->second[0][0].item<float>();
  }
};

TEST(ServerCore, PredictAsyncAnswersExactlyOnceOnABatchThreadOrInlineForImmediateErrors) {
  TempDir dir;
  std::string base = dir.path() + "/m";
  save_tiny_model(base + "/1", 1.0f);
  ServerCoreOptions o;
  o.config.models = {model_config("m", base)};
  o.file_system_poll_wait_seconds = 0;
  o.enable_batching = true;
  o.batching.max_batch_size = 4;
  o.batching.batch_timeout_micros = 0;
  o.batching.num_batch_threads = 1;
  auto ok = std::make_unique<AsyncAnswer>(), model_error = std::make_unique<AsyncAnswer>(),
       bad = std::make_unique<AsyncAnswer>();
  {
    ServerCore core(o);
    core.start();
    auto h = core.get({"m"});
    const std::string in = input_name(*h);
    core.predict_async(h, "", {{in, at::ones({2, 4})}}, std::nullopt, ok->fn());
    core.predict_async(h, "serving_default", {{in, at::ones({1, 5})}}, std::nullopt, model_error->fn());
    core.predict_async(h, "", {{in, at::ones({2, 4})}, {"other", at::ones({3, 4})}}, std::nullopt, bad->fn());
    // Inputs that disagree on dim 0: answered before predict_async returns, here.
    EXPECT_EQ(bad->count(), 1);
    EXPECT_EQ(bad->thread, std::this_thread::get_id());
    EXPECT_EQ(bad->code(), Code::kInvalidArgument);
    ASSERT_TRUE(ok->wait());
    ASSERT_TRUE(model_error->wait());
    EXPECT_EQ(ok->code(), Code::kOk);
    EXPECT_NE(ok->thread, std::this_thread::get_id());
    EXPECT_FLOAT_EQ(ok->first_output(), tiny_output(1.0f, {1, 1, 1, 1}));
    EXPECT_EQ(ok->timing.batch_size, 2);
    EXPECT_GE(ok->timing.queue_us, 0);
    EXPECT_NE(model_error->code(), Code::kOk);  // the model's error (4 features expected, 5 given)
    EXPECT_NE(model_error->thread, std::this_thread::get_id());
    EXPECT_EQ(model_error->thread, ok->thread);  // the one batch thread
    EXPECT_NE(core.metrics().expose().find("kiln_batch_size_bucket"), std::string::npos);
    // The blocking predict() runs on top and still throws the codes.
    try {
      core.predict(*h, "", {{in, at::ones({2, 4})}, {"other", at::ones({3, 4})}});
      ADD_FAILURE();
    } catch (const ServingError& e) {
      EXPECT_EQ(e.code(), Code::kInvalidArgument);
    }
  }
  // The core is gone (its batch threads joined): nobody answered twice.
  EXPECT_EQ(ok->count(), 1);
  EXPECT_EQ(model_error->count(), 1);
  EXPECT_EQ(bad->count(), 1);

  // Without batching (and no compute threads: the default), the compute and `done` run on the caller.
  o.enable_batching = false;
  ServerCore plain(o);
  plain.start();
  auto h = plain.get({"m"});
  AsyncAnswer inline_answer;
  plain.predict_async(h, "", {{input_name(*h), at::ones({3, 4})}}, std::nullopt, inline_answer.fn());
  EXPECT_EQ(inline_answer.count(), 1);
  EXPECT_EQ(inline_answer.thread, std::this_thread::get_id());
  EXPECT_EQ(inline_answer.code(), Code::kOk);
  EXPECT_EQ(inline_answer.timing.batch_size, 3);
}

TEST(ServerCore, WithoutBatchingPredictAsyncComputesOnTheComputeThreadsAndAnswersOnce) {
  TempDir dir;
  std::string base = dir.path() + "/m";
  save_tiny_model(base + "/1", 1.0f);
  ServerCoreOptions o;
  o.config.models = {model_config("m", base)};
  o.file_system_poll_wait_seconds = 0;
  o.num_compute_threads = 1;
  auto ok = std::make_unique<AsyncAnswer>(), model_error = std::make_unique<AsyncAnswer>(),
       expired = std::make_unique<AsyncAnswer>();
  {
    ServerCore core(o);
    core.start();
    auto h = core.get({"m"});
    const std::string in = input_name(*h);
    core.predict_async(h, "", {{in, at::ones({2, 4})}}, std::nullopt, ok->fn());
    core.predict_async(h, "", {{in, at::ones({1, 5})}}, std::nullopt, model_error->fn());
    core.predict_async(h, "", {{in, at::ones({1, 4})}}, Clock::now() - std::chrono::seconds(1), expired->fn());
    ASSERT_TRUE(ok->wait());
    ASSERT_TRUE(model_error->wait());
    ASSERT_TRUE(expired->wait());
    EXPECT_EQ(ok->code(), Code::kOk);
    EXPECT_NE(ok->thread, std::this_thread::get_id());
    EXPECT_FLOAT_EQ(ok->first_output(), tiny_output(1.0f, {1, 1, 1, 1}));
    EXPECT_EQ(ok->timing.batch_size, 2);
    EXPECT_GE(ok->timing.queue_us, 0);
    // The model's error (4 features expected, 5 given) reaches `done` on the compute thread.
    EXPECT_NE(model_error->code(), Code::kOk);
    EXPECT_EQ(model_error->thread, ok->thread);  // the one compute thread
    EXPECT_EQ(expired->code(), Code::kDeadlineExceeded);
    // The blocking predict() runs on top, with its own copy of the handle.
    auto out = core.predict(*h, "", {{in, at::ones({1, 4})}});
    EXPECT_FLOAT_EQ(out.begin()->second[0][0].item<float>(), tiny_output(1.0f, {1, 1, 1, 1}));
  }
  EXPECT_EQ(ok->count(), 1);
  EXPECT_EQ(model_error->count(), 1);
  EXPECT_EQ(expired->count(), 1);
}

TEST(ServerCore, RecordRequestCountsEachLabelSetInItsOwnSeries) {
  ServerCoreOptions o;
  o.file_system_poll_wait_seconds = 0;
  ServerCore core(o);
  RequestTiming t;
  t.parse_us = 250000;  // seconds exact in binary: the sums below print exactly
  t.compute_us = 500000;
  // Twice the same labels (the second finds the cached series), then ones
  // that differ in one label each: each counts in its own series.
  core.record_request("m", 1, "rest", "predict", Status{}, t);
  core.record_request("m", 1, "rest", "predict", Status{}, t);
  core.record_request("m", 1, "grpc", "predict", Status{}, t);
  core.record_request("m", 2, "rest", "predict", Status{}, t);
  core.record_request("m", 1, "rest", "predict", Status{Code::kInvalidArgument, "bad"}, t);
  core.record_request("mm", 1, "rest", "predict", Status{}, t);
  const std::string text = core.metrics().expose();
  auto has = [&](const std::string& line) { return text.find(line + "\n") != std::string::npos; };
  EXPECT_TRUE(has(R"(kiln_requests_total{api="predict",code="OK",model="m",protocol="rest",version="1"} 2)")) << text;
  EXPECT_TRUE(has(R"(kiln_requests_total{api="predict",code="OK",model="m",protocol="grpc",version="1"} 1)"));
  EXPECT_TRUE(has(R"(kiln_requests_total{api="predict",code="OK",model="m",protocol="rest",version="2"} 1)"));
  EXPECT_TRUE(
      has(R"(kiln_requests_total{api="predict",code="INVALID_ARGUMENT",model="m",protocol="rest",version="1"} 1)"));
  EXPECT_TRUE(has(R"(kiln_requests_total{api="predict",code="OK",model="mm",protocol="rest",version="1"} 1)"));
  // Latency: only OK requests, one series per phase.
  EXPECT_TRUE(has(R"(kiln_request_latency_seconds_count{model="m",phase="total",protocol="rest",version="1"} 2)"));
  EXPECT_TRUE(has(R"(kiln_request_latency_seconds_sum{model="m",phase="compute",protocol="rest",version="1"} 1)"));
  EXPECT_TRUE(has(R"(kiln_request_latency_seconds_sum{model="m",phase="total",protocol="grpc",version="1"} 0.75)"));
}

TEST(ServerCore, RejectsInvalidComputeThreadOptions) {
  ServerCoreOptions o;
  o.num_compute_threads = -1;
  EXPECT_THROW(o.validate(), ValueError);
  o.num_compute_threads = 0;
  o.max_queued_computes = 0;
  EXPECT_THROW(o.validate(), ValueError);
}

TEST(ServerCore, ModelsShareOneBatchSchedulerAndAQuiescingVersionDrainsItsQueue) {
  TempDir dir;
  std::string base_m = dir.path() + "/m", base_n = dir.path() + "/n";
  save_tiny_model(base_m + "/1", 1.0f);
  save_tiny_model(base_n + "/1", 0.5f);
  ServerCoreOptions o;
  o.config.models = {model_config("m", base_m), model_config("n", base_n)};
  o.file_system_poll_wait_seconds = 0;
  o.enable_batching = true;
  o.batching.max_batch_size = 8;
  o.batching.batch_timeout_micros = 60000000;  // 60 s: in this test batches close when full
  o.batching.num_batch_threads = 1;
  ServerCore core(o);
  core.start();
  auto hm = core.get({"m"}), hn = core.get({"n"});
  const std::string in = input_name(*hm);
  // Full batches of both models run on the core's one batch thread.
  AsyncAnswer am, an;
  core.predict_async(hm, "", {{in, at::ones({8, 4})}}, std::nullopt, am.fn());
  core.predict_async(hn, "", {{input_name(*hn), at::ones({8, 4})}}, std::nullopt, an.fn());
  ASSERT_TRUE(am.wait());
  ASSERT_TRUE(an.wait());
  EXPECT_EQ(am.code(), Code::kOk);
  EXPECT_EQ(an.code(), Code::kOk);
  EXPECT_FLOAT_EQ(am.first_output(), tiny_output(1.0f, {1, 1, 1, 1}));
  EXPECT_FLOAT_EQ(an.first_output(), tiny_output(0.5f, {1, 1, 1, 1}));
  EXPECT_EQ(am.thread, an.thread);
  EXPECT_NE(am.thread, std::this_thread::get_id());
  hn.reset();

  // One row waits in version 1's queue (the batch is not full); only the
  // request holds the version now.
  auto filler = core.get({"m"});
  AsyncAnswer pending, fill;
  core.predict_async(hm, "", {{in, at::ones({1, 4})}}, std::nullopt, pending.fn());
  hm.reset();
  save_tiny_model(base_m + "/2", 2.0f);
  core.poll_now();
  ASSERT_TRUE(core.wait_until_ready({"m", 2, std::nullopt}, 30));
  ASSERT_TRUE(wait_for([&] { return state_of(core, "m", 1) == VersionState::kQuiescing; }));
  EXPECT_EQ(pending.count(), 0);  // still queued: version 1 quiesces, its queue is not removed
  // Filling the batch runs it on version 1; then version 1 unloads.
  core.predict_async(filler, "", {{in, at::ones({7, 4})}}, std::nullopt, fill.fn());
  filler.reset();
  ASSERT_TRUE(pending.wait());
  ASSERT_TRUE(fill.wait());
  EXPECT_EQ(pending.code(), Code::kOk);
  EXPECT_FLOAT_EQ(pending.first_output(), tiny_output(1.0f, {1, 1, 1, 1}));  // version 1's weights
  EXPECT_EQ(pending.timing.batch_size, 8);
  ASSERT_TRUE(wait_for([&] { return state_of(core, "m", 1) == VersionState::kDisabled; }));
  auto h2 = core.get({"m"});
  EXPECT_EQ(h2->version, 2);
}

}  // namespace
}  // namespace kiln::serving
