// Serving on a GPU (`kiln serve --device cuda`), each check against the
// same server on the CPU: a version's own stream, batches assembled in
// page-locked memory, the device memory gauge, and unloading that gives the
// GPU memory back. Tests named *CUDA* need a GPU (the test main skips them
// where there is none; scripts/gpu_check.sh runs them on a GPU machine).
// The CPU side of the same features (the gauge, the batching defaults) is
// tested in server_core_test.cc, loader_test.cc and lifecycle_test.cc.
#include <gtest/gtest.h>

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <atomic>
#include <cmath>
#include <iostream>
#include <mutex>
#include <thread>

#include "kiln/core/device.h"
#include "kiln/core/device_memory.h"
#include "kiln/core/names.h"
#include "kiln/core/random.h"
#include "kiln/serving/serving_test_util.h"

namespace kiln::serving {
namespace {

using namespace kiln::serving::testing;

#define KILN_SKIP_WITHOUT_GPU() \
  if (gpu_count() == 0) GTEST_SKIP() << "no GPU: this test serves a model on cuda:0 and compares with the CPU"

// The process's default device (what the server's loader threads load on)
// and IEEE float32 products (TF32 off), so a GPU server's answers are the
// CPU server's to float32 rounding; both restored at the end of the scope.
class ServeOn {
 public:
  explicit ServeOn(const at::Device& device) : tf32_(tf32_enabled()) {
    set_default_device(device);
    set_tf32_enabled(false);
  }
  ~ServeOn() {
    set_default_device(std::nullopt);
    set_tf32_enabled(tf32_);
  }

 private:
  bool tf32_;
};

// Input(in) -> Dense(hidden, relu) x layers -> Dense(out), seeded, saved at dir.
ModelPtr save_mlp(const std::string& dir, int64_t in, int64_t hidden, int layers, int64_t out, uint64_t seed) {
  clear_session();
  set_random_seed(seed);
  auto m = models::Sequential();
  m->add(layers::Input({in}));
  for (int i = 0; i < layers; ++i) m->add(layers::Dense(hidden, "relu"));
  m->add(layers::Dense(out));
  m->save(dir);
  return m;
}

int64_t weight_bytes(const models::Model& m) {
  int64_t n = 0;
  for (auto& w : m.weights()) n += (int64_t)w->value().nbytes();
  return n;
}

std::string row_body(const at::Tensor& row) {
  Json instance = Json::array();
  for (int64_t i = 0; i < row.size(0); ++i) instance.push_back(row[i].item<float>());
  return Json{{"instances", Json::array({instance})}}.dump();
}

std::vector<float> first_prediction(const httplib::Result& r) {
  EXPECT_TRUE(r);
  if (!r) return {};
  EXPECT_EQ(r->status, 200) << r->body;
  return Json::parse(r->body)["predictions"][0].get<std::vector<float>>();
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-4 + 1e-4 * std::abs(want[i])) << what << " [" << i << "]";
}

ServerCoreOptions batching_server(const std::vector<ModelConfig>& models) {
  ServerCoreOptions o;
  o.config.models = models;
  o.file_system_poll_wait_seconds = 0;
  o.enable_batching = true;  // the devices' defaults: nothing set here
  return o;
}

// cuBLAS's workspaces for one (thread, stream) pair, as `model_dir`'s
// products allocate them: LibTorch keeps a workspace per cuBLAS handle
// (one per thread) and stream, through the caching allocator, for the life
// of the process. They are LibTorch's, not a version's: a version on a new
// stream leaves one behind for each thread that computed on it (bounded:
// threads x the pool's 32 streams). Measured on this thread and a pool
// stream it has not used, with the model's own products.
DeviceMemoryStats cublas_workspace(const std::string& model_dir, const at::Device& gpu, int64_t in) {
  ModelPtr model = load_model(model_dir);  // on the default device: the GPU
  empty_device_cache(gpu);
  const DeviceMemoryStats a = device_memory_stats(gpu);
  {
    const c10::impl::VirtualGuardImpl impl(gpu.type());
    c10::StreamGuard on(impl.getStreamFromGlobalPool(gpu, /*isHighPriority=*/false));
    for (int64_t rows : {1, 64}) model->predict_on_batch({at::randn({rows, in})});  // host outputs
  }
  empty_device_cache(gpu);
  const DeviceMemoryStats b = device_memory_stats(gpu);
  return {b.allocated_bytes - a.allocated_bytes, b.reserved_bytes - a.reserved_bytes};
}

TEST(ServingCUDA, UnloadReturnsDeviceMemoryWithin5Percent) {
  KILN_SKIP_WITHOUT_GPU();
  TempDir dir;
  const std::string base = dir.path() + "/m";
  // 1024 -> 4096 -> 4096 -> 16: 21M weights, 84 MB.
  ModelPtr cpu_model = save_mlp(base + "/1", 1024, 4096, 2, 16, 7);
  const int64_t bytes = weight_bytes(*cpu_model);
  at::Tensor x = at::randn({3, 1024});
  at::Tensor want = cpu_model->predict_on_batch({x})[0];
  cpu_model.reset();

  const at::Device gpu(at::kCUDA, 0);
  ServeOn on(gpu);
  const DeviceMemoryStats workspace = cublas_workspace(base + "/1", gpu, 1024);
  empty_device_cache(gpu);
  const DeviceMemoryStats before = device_memory_stats(gpu);

  ServerCoreOptions o = batching_server({model_config("m", base)});
  // One batch thread: the version's products run on one (thread, stream)
  // pair; the loader thread may add a second (its default stream).
  o.batching.num_batch_threads = 1;
  Served s(o);
  for (int64_t i = 0; i < x.size(0); ++i) {
    auto r = s.client()->Post("/v1/models/m:predict", row_body(x[i]), "application/json");
    std::vector<float> w(want[i].data_ptr<float>(), want[i].data_ptr<float>() + want.size(1));
    expect_close(first_prediction(r), w, "row " + std::to_string(i));
  }
  const DeviceMemoryStats loaded = device_memory_stats(gpu);
  EXPECT_GE(loaded.allocated_bytes - before.allocated_bytes, bytes) << "the weights are on the GPU";
  const std::string metrics = s.core->metrics().expose();
  EXPECT_NE(metrics.find("kiln_model_device_memory_bytes{device=\"cuda:0\",model=\"m\",version=\"1\"} " +
                         std::to_string(bytes) + "\n"),
            std::string::npos)
      << metrics;

  s.core->unload_model("m");
  ASSERT_TRUE(s.core->wait_until_idle(60));
  const DeviceMemoryStats after = device_memory_stats(gpu);
  const int64_t took = loaded.reserved_bytes - before.reserved_bytes;
  std::cout << "device memory (allocated / reserved bytes): before " << before.allocated_bytes << " / "
            << before.reserved_bytes << ", loaded " << loaded.allocated_bytes << " / " << loaded.reserved_bytes
            << ", after unload " << after.allocated_bytes << " / " << after.reserved_bytes << "; weights " << bytes
            << "; one cuBLAS workspace " << workspace.allocated_bytes << " / " << workspace.reserved_bytes << "\n";
  EXPECT_GE(took, bytes);
  // At least 95% of what loading took went back to the driver, and the
  // tensors left alive are within 5% of the weights' size of the baseline,
  // beyond LibTorch's cuBLAS workspaces for at most two new pairs.
  EXPECT_LE(after.reserved_bytes - before.reserved_bytes, took / 20 + 2 * workspace.reserved_bytes);
  EXPECT_LE(after.allocated_bytes - before.allocated_bytes, bytes / 20 + 2 * workspace.allocated_bytes);
  EXPECT_EQ(s.core->metrics().expose().find("kiln_model_device_memory_bytes"), std::string::npos);
}

TEST(ServingCUDA, StreamsAndPinnedBatchesPredictAsTheCpuServer) {
  KILN_SKIP_WITHOUT_GPU();
  TempDir dir;
  const std::string a = dir.path() + "/a", b = dir.path() + "/b";
  save_mlp(a + "/1", 16, 64, 2, 4, 1);
  save_mlp(b + "/1", 16, 32, 1, 3, 2);
  const std::vector<ModelConfig> models = {model_config("a", a), model_config("b", b)};
  at::Tensor rows = at::randn({64, 16});

  // The answers of the same server on the CPU, one request at a time.
  std::map<std::string, std::vector<std::vector<float>>> want;
  {
    Served cpu(batching_server(models));
    auto c = cpu.client();
    for (const char* m : {"a", "b"})
      for (int64_t i = 0; i < rows.size(0); ++i)
        want[m].push_back(first_prediction(
            c->Post(std::string("/v1/models/") + m + ":predict", row_body(rows[i]), "application/json")));
  }

  const at::Device gpu(at::kCUDA, 0);
  ServeOn on(gpu);
  Served s(batching_server(models));
  // Each version on the GPU, with a stream of its own (not the default one).
  const c10::impl::VirtualGuardImpl impl(gpu.type());
  std::vector<c10::Stream> streams;
  for (const char* m : {"a", "b"}) {
    ServableHandlePtr h = s.core->get({m});
    auto* servable = dynamic_cast<ModelServable*>(h->servable.get());
    ASSERT_NE(servable, nullptr);
    EXPECT_EQ(servable->device(), gpu);
    ASSERT_TRUE(servable->stream().has_value());
    EXPECT_NE(*servable->stream(), impl.getDefaultStream(gpu));
    streams.push_back(*servable->stream());
  }
  EXPECT_NE(streams[0], streams[1]) << "two versions, two streams";

  // 8 clients at once: batches of several rows, assembled in page-locked
  // memory, both models computing at the same time.
  std::atomic<int> checked{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 8; ++t)
    clients.emplace_back([&, t] {
      auto c = s.client();
      for (int64_t i = t; i < rows.size(0); i += 8)
        for (const char* m : {"a", "b"}) {
          auto r = c->Post(std::string("/v1/models/") + m + ":predict", row_body(rows[i]), "application/json");
          expect_close(first_prediction(r), want.at(m)[i], std::string(m) + " row " + std::to_string(i));
          ++checked;
        }
    });
  for (auto& c : clients) c.join();
  EXPECT_EQ(checked.load(), 2 * rows.size(0));
  const std::string metrics = s.core->metrics().expose();
  EXPECT_NE(metrics.find("kiln_model_device_memory_bytes{device=\"cuda:0\",model=\"a\",version=\"1\"}"),
            std::string::npos)
      << metrics;
}

TEST(ServingCUDA, BatchesForAGpuAreAssembledInPinnedMemory) {
  KILN_SKIP_WITHOUT_GPU();
  BatchingOptions o;
  o.max_batch_size = 4;
  o.batch_timeout_micros = 200000;  // the three requests below make one batch
  o.allowed_batch_sizes = {2, 4};
  o.num_batch_threads = 1;
  o = batching_for_device(o, at::Device(at::kCUDA, 0));
  ASSERT_TRUE(o.pin_batches);
  SharedBatchScheduler scheduler(o);
  std::mutex mu;
  std::vector<at::Tensor> seen;
  BatchQueuePtr q = scheduler.add_queue(o, [&](const std::string&, const TensorMap& batch) {
    std::lock_guard<std::mutex> l(mu);
    seen.push_back(batch.at("x"));
    return TensorMap{{"y", batch.at("x") * 2}};
  });
  std::vector<std::thread> callers;
  std::vector<at::Tensor> outs(3);
  for (int i = 0; i < 3; ++i)
    callers.emplace_back([&, i] {
      outs[i] = scheduler.run(q, "serving_default", {{"x", at::full({1, 5}, (float)i)}}).at("y");
    });
  for (auto& c : callers) c.join();
  ASSERT_EQ(seen.size(), 1u) << "one batch of three rows";
  EXPECT_TRUE(seen[0].is_pinned());
  EXPECT_EQ(seen[0].size(0), 4) << "padded to the allowed size 4";
  EXPECT_TRUE(at::equal(seen[0][3], seen[0][2])) << "padding repeats the last row";
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(at::allclose(outs[i], at::full({1, 5}, 2.0f * i))) << i;
  scheduler.remove_queue(q);
}

}  // namespace
}  // namespace kiln::serving
