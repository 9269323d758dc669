// ModelParallel: every supported layer and a small transformer block,
// sharded over real multi-process meshes (2), (1,2), (2,1) and (2,2) on
// loopback, against the same models in one process without a distribution:
// forward outputs, one SGD step with learning rate 1 (the weights then
// differ from the initial ones by exactly the gradient) and the weights
// after six SGD-with-momentum steps all match to 5e-5 absolute (float32; the
// sharded sums add in another order), 3e-2 for the mixed_bfloat16 MLP (its
// partial sums are rounded to bfloat16 before the all-reduce).
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "kiln/core/random.h"
#include "kiln/distribute/data_parallel.h"
#include "kiln/distribute/model_parallel.h"
#include "kiln/layers/attention.h"
#include "kiln/layers/config_reader.h"
#include "kiln/layers/dense.h"
#include "kiln/layers/dropout.h"
#include "kiln/layers/einsum_dense.h"
#include "kiln/layers/embedding.h"
#include "kiln/layers/merging.h"
#include "kiln/layers/normalization.h"
#include "kiln/layers/pooling.h"
#include "kiln/layers/reshaping.h"
#include "kiln/models/functional.h"
#include "kiln/models/sequential.h"
#include "kiln/optimizers/optimizer.h"
#include "kiln/saving/safetensors.h"
#include "kiln/saving/sharded_weights.h"
#include "kiln/testing/expect_error.h"
#include "kiln/testing/testing.h"
#include "kiln/training/backup_and_restore.h"
#include "kiln/training/model_checkpoint.h"

namespace kiln {
namespace {

using distribute::DeviceMesh;
using distribute::LayoutMap;
using distribute::ModelParallel;

constexpr int64_t kRows = 8;
constexpr double kTolerance = 5e-5;
constexpr double kBfloat16Tolerance = 3e-2;

struct Case {
  std::string name;
  std::function<std::shared_ptr<models::Model>()> build;
  std::function<at::Tensor()> input;  // drawn after the build, from the case's seed
  std::map<std::string, TensorLayout> layouts;
};

TensorLayout L(std::vector<std::string> axes) { return TensorLayout{std::move(axes)}; }

std::shared_ptr<models::Model> sequential(const std::string& name, Shape input, std::vector<LayerPtr> layers,
                                          at::ScalarType dtype = at::kFloat) {
  auto m = models::Sequential(std::vector<LayerPtr>{}, name);
  m->add(layers::Input(input, dtype));
  for (auto& l : layers) m->add(l);
  return m;
}

Json named(const std::string& n) { return Json{{"name", n}}; }

at::Tensor floats(Shape s) { return at::randn(s); }

std::vector<Case> cases() {
  std::vector<Case> c;
  // Column-parallel, then a replicated layer: the output is gathered.
  c.push_back({"col",
               [] {
                 return sequential("col", {8},
                                   {layers::Dense(16, "relu", named("d1")), layers::Dense(4, "linear", named("d2"))});
               },
               [] {
                 return floats({kRows, 8});
               },
               {{"col/d1/kernel", L({"", "model"})}, {"col/d1/bias", L({"model"})}}});
  // Megatron's MLP: column- then row-parallel with no gather between; the
  // first bias is replicated (its gradient is summed over the axis).
  c.push_back({"mlp",
               [] {
                 return sequential("mlp", {8},
                                   {layers::Dense(16, "relu", named("d1")), layers::Dense(8, "tanh", named("d2")),
                                    layers::Dense(4, "linear", named("d3"))});
               },
               [] {
                 return floats({kRows, 8});
               },
               {{"mlp/d1/kernel", L({"", "model"})}, {"mlp/d2/kernel", L({"model", ""})}}});
  // The same under mixed_bfloat16: 16-bit activations cross the ranks.
  c.push_back({"mlp_bf16",
               [] {
                 Json bf16{{"dtype", "mixed_bfloat16"}};
                 return sequential("mlp_bf16", {8},
                                   {layers::Dense(16, "relu", merged_config(named("d1"), bf16)),
                                    layers::Dense(8, "tanh", merged_config(named("d2"), bf16)),
                                    layers::Dense(4, "linear", merged_config(named("d3"), bf16))});
               },
               [] {
                 return floats({kRows, 8});
               },
               {{"mlp_bf16/d1/kernel", L({"", "model"})}, {"mlp_bf16/d2/kernel", L({"model", ""})}}});
  // Row-parallel on a whole input (sliced here, gathered back in backward).
  c.push_back({"row",
               [] {
                 return sequential("row", {8},
                                   {layers::Dense(16, "relu", named("d1")), layers::Dense(4, "linear", named("d2"))});
               },
               [] {
                 return floats({kRows, 8});
               },
               {{"row/d2/kernel", L({"model", ""})}}});
  c.push_back({"einsum",
               [] {
                 return sequential("einsum", {3, 8},
                                   {layers::EinsumDense("abc,cde->abde", Shape{kNone, 4, 2}, "de", "relu", named("e1")),
                                    layers::Flatten(), layers::Dense(4, "linear", named("d2"))});
               },
               [] {
                 return floats({kRows, 3, 8});
               },
               {{"einsum/e1/kernel", L({"", "model", ""})}, {"einsum/e1/bias", L({"model", ""})}}});
  for (const std::string kind : {"vocab", "feature"}) {
    const std::string name = "emb_" + kind;
    c.push_back({name,
                 [name] {
                   return sequential(name, {5},
                                     {layers::Embedding(12, 6, named("emb")), layers::Flatten(),
                                      layers::Dense(4, "linear", named("d2"))},
                                     at::kLong);
                 },
                 [] {
                   return at::randint(0, 12, {kRows, 5}, at::kLong);
                 },
                 {{name + "/emb/embeddings", kind == "vocab" ? L({"model", ""}) : L({"", "model"})}}});
  }
  // Functional graphs are planned too: column- then row-parallel through
  // Dropout (no gather); a split output that also feeds a replicated layer
  // is gathered.
  c.push_back({"fmlp",
               [] {
                 auto x = layers::Input({8});
                 auto h = layers::Dense(16, "relu", named("f1"))(x);
                 h = layers::Dropout(0.0)(h);
                 h = layers::Dense(8, "tanh", named("f2"))(h);
                 auto out = layers::Dense(4, "linear", named("f3"))(h);
                 return models::Functional(KerasTensors{x}, KerasTensors{out}, "fmlp");
               },
               [] {
                 return floats({kRows, 8});
               },
               {{"f1/kernel", L({"", "model"})}, {"f1/bias", L({"model"})}, {"f2/kernel", L({"model", ""})}}});
  c.push_back({"fmix",
               [] {
                 auto x = layers::Input({8});
                 auto h = layers::Dense(16, "relu", named("m1"))(x);
                 auto a = layers::Dense(8, "linear", named("m2"))(h);
                 auto b = layers::Dense(8, "linear", named("m3"))(h);
                 auto s = layers::Add()(KerasTensors{a, b})[0];
                 auto out = layers::Dense(4, "linear", named("m4"))(s);
                 return models::Functional(KerasTensors{x}, KerasTensors{out}, "fmix");
               },
               [] {
                 return floats({kRows, 8});
               },
               {{"m1/kernel", L({"", "model"})}, {"m1/bias", L({"model"})}, {"m2/kernel", L({"model", ""})}}});
  // A transformer block: attention heads sharded (query/key/value
  // column-parallel, the output projection row-parallel), then an MLP kept
  // sharded between its layers by the layout map's output key.
  c.push_back({"block",
               [] {
                 auto x = layers::Input({4, 8});
                 auto att = layers::MultiHeadAttention(2, 4, named("att"))(KerasTensors{x, x})[0];
                 auto h = layers::LayerNormalization(-1, 1e-3, named("ln"))(layers::Add()(KerasTensors{x, att})[0]);
                 auto f = layers::Dense(16, "relu", named("ffn_in"))(h);
                 f = layers::Dense(8, "linear", named("ffn_out"))(f);
                 auto p = layers::GlobalAveragePooling1D()(layers::Add()(KerasTensors{h, f})[0]);
                 auto out = layers::Dense(4, "linear", named("head"))(p);
                 return models::Functional(KerasTensors{x}, KerasTensors{out}, "block");
               },
               [] {
                 return floats({kRows, 4, 8});
               },
               {{"att/query/kernel", L({"", "model", ""})},
                {"att/query/bias", L({"model", ""})},
                {"att/key/kernel", L({"", "model", ""})},
                {"att/key/bias", L({"model", ""})},
                {"att/value/kernel", L({"", "model", ""})},
                {"att/value/bias", L({"model", ""})},
                {"att/attention_output/kernel", L({"model", "", ""})},
                {"ffn_in/kernel", L({"", "model"})},
                {"ffn_in/bias", L({"model"})},
                {"ffn_in/output", L({"", "", "model"})},
                {"ffn_out/kernel", L({"model", ""})}}});
  return c;
}

// Every variable's whole value (gathered from the shards: a collective).
void add_weights(NamedTensors& out, const std::string& prefix, models::Model& m) {
  auto d = distribution();
  for (auto& v : m.weights()) out.emplace_back(prefix + v->path(), (d ? d->gather_variable(*v) : v->value()).clone());
}

// Runs every case in this process (under the active distribution, if any).
NamedTensors run_cases(NamedTensors* comm = nullptr) {
  NamedTensors out, unused;
  if (!comm) comm = &unused;
  uint64_t seed = 100;
  for (const Case& c : cases()) {
    set_random_seed(seed++);
    auto m = c.build();
    at::Tensor x = c.input();
    at::Tensor y = at::randn({kRows, 4});
    for (auto& v : m->weights()) {
      const auto& layouts = c.layouts;
      auto it = layouts.find(v->path());
      if (it != layouts.end() && distribution() && distribution()->mesh_axis_size("model") > 1)
        EXPECT_TRUE(v->sharded()) << v->path() << " was not sharded";
    }
    auto mp = std::dynamic_pointer_cast<ModelParallel>(distribution());
    const auto before = mp ? mp->axis_collectives() : ModelParallel::AxisCollectives{};
    out.emplace_back(c.name + "/output", (*m)(x).detach());
    if (mp) {  // the forward pass's collectives (kept apart: the single run has none)
      const auto after = mp->axis_collectives();
      comm->emplace_back(c.name + "/all_reduces", at::tensor({after.all_reduces - before.all_reduces}, at::kLong));
      comm->emplace_back(c.name + "/all_gathers", at::tensor({after.all_gathers - before.all_gathers}, at::kLong));
    }
    int64_t local = 0;
    for (auto& v : m->weights()) local += v->value().numel();
    out.emplace_back(c.name + "/local_params", at::tensor({local}, at::kLong));
    // One SGD step with learning rate 1: new weights = initial - gradient.
    m->compile(CompileArgs::from_json(
        {{"optimizer", {{"class_name", "SGD"}, {"config", {{"learning_rate", 1.0}}}}}, {"loss", "mse"}}));
    m->fit({.x = {x}, .y = {y}, .batch_size = kRows, .epochs = 1, .verbose = 0, .shuffle = false});
    add_weights(out, c.name + "/step1/", *m);
    m->compile(CompileArgs::from_json(
        {{"optimizer", {{"class_name", "SGD"}, {"config", {{"learning_rate", 0.05}, {"momentum", 0.9}}}}},
         {"loss", "mse"}}));
    m->fit({.x = {x}, .y = {y}, .batch_size = kRows / 2, .epochs = 3, .verbose = 0, .shuffle = false});
    add_weights(out, c.name + "/momentum/", *m);
  }
  return out;
}

LayoutMap all_layouts(const DeviceMesh& mesh) {
  LayoutMap map(mesh);
  for (const Case& c : cases())
    for (auto& [k, l] : c.layouts) map.set(k, l);
  return map;
}

// Runs only as a rank started by ModelParallelJobs.*.
TEST(ModelParallelRank, Run) {
  const char* mesh_env = std::getenv("KILN_TEST_MESH");
  if (!mesh_env) GTEST_SKIP() << "runs only as a rank started by ModelParallelJobs.*";
  const std::string mesh_s = mesh_env;
  DeviceMesh mesh =
      mesh_s == "2" ? DeviceMesh({2}, {"model"}) : DeviceMesh({mesh_s[0] - '0', mesh_s[2] - '0'}, {"batch", "model"});
  set_distribution(std::make_shared<ModelParallel>(all_layouts(mesh), mesh_s == "2" ? "" : "batch"));
  NamedTensors comm;
  NamedTensors out = run_cases(&comm);
  const std::string path = std::string(std::getenv("KILN_TEST_OUT")) + "." + std::to_string(process_index());
  save_safetensors(path, out);
  save_safetensors(path + ".comm", comm);
  set_distribution(nullptr);
}

// Runs `argv` as the `n` ranks of one job on loopback (logs
// "<log_prefix><rank>.log", bounded at 240 s each); true when every rank
// exits 0 (the failing rank's log goes to the test output otherwise).
bool run_job(const std::vector<std::string>& argv, int n, const std::map<std::string, std::string>& extra,
             const std::string& log_prefix) {
  const int port = free_loopback_port();
  // A rank left waiting in a collective (a missed save, say) fails in 60 s.
  std::map<std::string, std::string> env = extra;
  env.emplace("KILN_COLLECTIVE_TIMEOUT", "60");
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r)
    pids.push_back(spawn_logged(argv, log_prefix + std::to_string(r) + ".log", rank_env(r, n, port, env)));
  bool ok = true;
  for (int r = 0; r < n; ++r) {
    const int code = wait_bounded(pids[r], 240);
    EXPECT_EQ(code, 0) << "rank " << r << ":\n" << read_file(log_prefix + std::to_string(r) + ".log");
    ok = ok && code == 0;
  }
  return ok;
}

class ModelParallelJobs : public ::testing::TestWithParam<std::string> {
 protected:
  TempDir dir_;
};

TEST_P(ModelParallelJobs, EveryLayerAndATransformerBlockMatchOneProcess) {
  const std::string mesh = GetParam();
  const int n = mesh == "2" ? 2 : (mesh[0] - '0') * (mesh[2] - '0');
  const std::string out = dir_.path() + "/out";
  ASSERT_TRUE(run_job({"/proc/self/exe", "--gtest_filter=ModelParallelRank.Run"}, n,
                      {{"KILN_TEST_MESH", mesh}, {"KILN_TEST_OUT", out}}, dir_.path() + "/rank"));

  const NamedTensors single = run_cases();
  const bool sharded = mesh != "2,1";
  for (int r = 0; r < n; ++r) {
    const NamedTensors ranked = load_safetensors(out + "." + std::to_string(r));
    ASSERT_EQ(ranked.size(), single.size());
    for (size_t i = 0; i < single.size(); ++i) {
      const auto& [name, want] = single[i];
      ASSERT_EQ(ranked[i].first, name);
      const at::Tensor& got = ranked[i].second;
      if (name.size() > 13 && name.substr(name.size() - 13) == "/local_params") {
        // The weights this rank holds: fewer when the model axis shards them.
        if (sharded) EXPECT_LT(got.item<int64_t>(), want.item<int64_t>()) << name;
        continue;
      }
      ASSERT_EQ(got.sizes(), want.sizes()) << name;
      // Relative to the tensor's scale (at least 1): sharding changes the
      // order of the sums, and momenta that grew to ~10 differ by more than
      // 5e-5 where the GEMM kernel blocks differently (AVX2 OpenBLAS).
      const double scale = std::max(1.0, want.to(at::kFloat).abs().max().item<double>());
      const double tolerance = (name.rfind("mlp_bf16/", 0) == 0 ? kBfloat16Tolerance : kTolerance) * scale;
      EXPECT_LT((got.to(at::kFloat) - want.to(at::kFloat)).abs().max().item<double>(), tolerance)
          << "mesh (" << mesh << "), rank " << r << ": " << name << " (largest magnitude " << scale << ")";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Meshes, ModelParallelJobs, ::testing::Values("2", "1,2", "2,1", "2,2"), [](const auto& info) {
  std::string s = info.param;
  for (auto& ch : s)
    if (ch == ',') ch = 'x';
  return "mesh_" + s;
});

// --- one process ------------------------------------------------------------------

TEST(ModelParallel, ClearErrorsForJobsAndLayoutsItCannotRun) {
  LayoutMap map(DeviceMesh({2}, {"model"}));
  map.set("dense.*kernel", L({"", "model"}));
  expect_error<ValueError>([&] { ModelParallel mp(map); }, {"2 devices", "1 processes", "--nproc_per_node 2"});
  LayoutMap two_d(DeviceMesh({1, 1}, {"batch", "model"}));
  two_d.set("k", L({"model", ""}));
  expect_error<ValueError>([&] { ModelParallel mp(two_d, "model"); }, {"batch_dim_name 'model'", "batch axis"});
  expect_error<ValueError>([&] { ModelParallel mp(two_d, "data"); }, {"data", "batch", "model"});
  // Unset: the first axis no layout uses (Keras: the first axis).
  EXPECT_EQ(ModelParallel(two_d).batch_dim_name(), "batch");
  EXPECT_EQ(ModelParallel(two_d, "").num_replicas(), 1);
}

TEST(ModelParallel, SpecConfigBuildsTheDistributionAndNamesBadEntries) {
  auto d = distribute::distribution_from_config(Json::parse(R"({"type": "model_parallel",
      "mesh": {"shape": [1, 1], "axis_names": ["batch", "model"]},
      "layout_map": {"dense.*kernel": [null, "model"]}, "batch_dim_name": "batch"})"));
  auto mp = std::dynamic_pointer_cast<ModelParallel>(d);
  ASSERT_TRUE(mp);
  EXPECT_EQ(mp->layout_map().get("mlp/dense_1/kernel")->axes, (std::vector<std::string>{"", "model"}));
  EXPECT_EQ(mp->batch_dim_name(), "batch");
  expect_error<ValueError>([] { distribute::distribution_from_config(Json::parse(R"({"type": "model_parallel"})")); },
                           {"`mesh`"});
  expect_error<ValueError>(
      [] {
        distribute::distribution_from_config(Json::parse(
            R"({"type": "model_parallel", "mesh": {"shape": [1], "axis_names": ["model"]}, "layout_map": {"k": [3]}})"));
      },
      {"layout_map[\"k\"]", "3"});
  expect_error<ValueError>(
      [] {
        distribute::distribution_from_config(Json::parse(
            R"({"type": "model_parallel", "mesh": {"shape": [1], "axis_names": ["model"]}, "layout_map": {"k": ["data"]}})"));
      },
      {"data"});
}

TEST(ModelParallel, OneDeviceMeshIsTheSingleProcessRun) {
  const NamedTensors single = run_cases();
  set_distribution(std::make_shared<ModelParallel>(all_layouts(DeviceMesh({1}, {"model"})), ""));
  const NamedTensors one = run_cases();
  set_distribution(nullptr);
  ASSERT_EQ(one.size(), single.size());
  for (size_t i = 0; i < single.size(); ++i) EXPECT_TRUE(at::equal(one[i].second, single[i].second)) << single[i].first;
}

// --- checkpoints across layouts -----------------------------------------------------

// A Megatron MLP trained with BackupAndRestore (Adam, shuffled batches).
std::shared_ptr<models::Model> checkpointed_model() {
  set_random_seed(5);
  auto m = sequential("ckpt", {8},
                      {layers::Dense(16, "relu", named("d1")), layers::Dense(8, "tanh", named("d2")),
                       layers::Dense(4, "linear", named("d3"))});
  m->compile(CompileArgs::from_names("adam", "mse"));
  return m;
}

std::pair<at::Tensor, at::Tensor> checkpoint_data() {
  at::Generator g = at::detail::createCPUGenerator(11);
  return {at::randn({kRows, 8}, g), at::randn({kRows, 4}, g)};
}

LayoutMap checkpoint_layouts(const DeviceMesh& mesh) {
  LayoutMap map(mesh);
  map.set("ckpt/d1/kernel", L({"", "model"}));
  map.set("ckpt/d1/bias", L({"model"}));
  map.set("ckpt/d2/kernel", L({"model", ""}));
  return map;
}

// With BackupAndRestore, and a ModelCheckpoint of the whole model each
// epoch ("<backup>/../epoch_<n>"; every process takes part in its save).
void fit_with_backup(models::Model& m, const std::string& backup, int epochs) {
  auto [x, y] = checkpoint_data();
  m.fit({.x = {x},
         .y = {y},
         .batch_size = kRows / 2,
         .epochs = epochs,
         .verbose = 0,
         .callbacks = {
             callbacks::BackupAndRestore(backup, callbacks::BackupAndRestoreOptions{.delete_checkpoint = false}),
             callbacks::ModelCheckpoint(backup + "/../epoch_{epoch}")}});
}

// Phase "first": one epoch with BackupAndRestore, then the model saved
// (every process gathers, process 0 writes). Phase "resume": a fresh model
// fit for two epochs on the same backup resumes after the first; its
// weights, and the saved model loaded here, are what the ranks report.
NamedTensors checkpoint_phase(const std::string& phase, const std::string& dir) {
  auto m = checkpointed_model();
  if (phase == "sharded_save") {  // one epoch, then both forms: per-process shards and the gathered directory
    auto [x, y] = checkpoint_data();
    m->fit({.x = {x}, .y = {y}, .batch_size = kRows / 2, .epochs = 1, .verbose = 0});
    save_sharded_weights(*m, dir + "/sharded");
    m->save(dir + "/whole");
    return {};
  }
  if (phase == "sharded_load") {
    load_sharded_weights(*m, dir + "/sharded");
    NamedTensors out;
    add_weights(out, "loaded/", *m);
    out.emplace_back("loaded/output", (*m)(checkpoint_data().first).detach());
    return out;
  }
  if (phase == "first") {
    fit_with_backup(*m, dir + "/backup", 1);
    m->save(dir + "/model");
    return {};
  }
  fit_with_backup(*m, dir + "/backup", 2);
  NamedTensors out;
  add_weights(out, "resumed/", *m);
  auto loaded = load_model(dir + "/model");
  add_weights(out, "loaded/", *loaded);
  out.emplace_back("loaded/output", (*loaded)(checkpoint_data().first).detach());
  return out;
}

TEST(ModelParallelCheckpointRank, Run) {
  const char* phase = std::getenv("KILN_TEST_PHASE");
  if (!phase) GTEST_SKIP() << "runs only as a rank started by ModelParallelCheckpoints.*";
  const std::string mesh_s = std::getenv("KILN_TEST_MESH");
  DeviceMesh mesh = mesh_s == "2" ? DeviceMesh({2}, {"model"}) : DeviceMesh({2, 2}, {"batch", "model"});
  LayoutMap layouts = checkpoint_layouts(mesh);
  if (std::getenv("KILN_TEST_OTHER_LAYOUT")) {  // d1 row- instead of column-parallel, d3 split too
    layouts.set("ckpt/d1/kernel", L({"model", ""}));
    layouts.set("ckpt/d1/bias", L({}));
    layouts.set("ckpt/d3/kernel", L({"", "model"}));
  }
  set_distribution(std::make_shared<ModelParallel>(layouts));
  NamedTensors out = checkpoint_phase(phase, std::getenv("KILN_TEST_DIR"));
  if (!out.empty())
    save_safetensors(std::string(std::getenv("KILN_TEST_DIR")) + "/out." + std::to_string(process_index()), out);
  set_distribution(nullptr);
}

// Saved from mesh (2) (the MLP's kernels sharded over two ranks), resumed by
// BackupAndRestore on mesh (2, 2) (sharded, and the batch split): the
// checkpoint and the model directory hold whole variables, so they load
// into another mesh, and into one process.
TEST(ModelParallelCheckpoints, SaveOnOneMeshResumeOnAnotherAndLoadInOneProcess) {
  TempDir dir;
  auto run = [&](const std::string& phase, const std::string& mesh, int n) {
    ASSERT_TRUE(run_job({"/proc/self/exe", "--gtest_filter=ModelParallelCheckpointRank.Run"}, n,
                        {{"KILN_TEST_MESH", mesh}, {"KILN_TEST_PHASE", phase}, {"KILN_TEST_DIR", dir.path()}},
                        dir.path() + "/" + phase));
  };
  run("first", "2", 2);
  // The saved model directory is an ordinary one: whole variables, loaded
  // in one process without a distribution.
  TempDir single_dir;
  {
    auto m = checkpointed_model();
    fit_with_backup(*m, single_dir.path() + "/backup", 1);
    // Model::save after fit, and ModelCheckpoint's save during it.
    for (const std::string saved : {"/model", "/epoch_1"}) {
      auto loaded = load_model(dir.path() + saved);
      auto want = m->weights();
      auto got = loaded->weights();
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(got[i]->shape(), want[i]->shape()) << saved << " " << want[i]->path();
        EXPECT_LT((got[i]->value() - want[i]->value()).abs().max().item<double>(), kTolerance)
            << saved << " " << want[i]->path();
      }
    }
  }
  run("resume", "2,2", 4);
  // One process resumes its own backup of the same first epoch; its
  // "loaded" entries read the sharded run's model directory.
  std::filesystem::copy(dir.path() + "/model", single_dir.path() + "/model", std::filesystem::copy_options::recursive);
  const NamedTensors single = checkpoint_phase("resume", single_dir.path());
  for (int r = 0; r < 4; ++r) {
    auto ranked = load_safetensors(dir.path() + "/out." + std::to_string(r));
    ASSERT_EQ(ranked.size(), single.size());
    for (size_t i = 0; i < single.size(); ++i) {
      ASSERT_EQ(ranked[i].first, single[i].first);
      EXPECT_LT((ranked[i].second - single[i].second).abs().max().item<double>(), kTolerance)
          << "rank " << r << ": " << single[i].first;
    }
  }
}

// The other form: per-process shard files plus an index, written without
// gathering, read back on another mesh with other layouts and in one
// process; every value arrives bit for bit (copies, no arithmetic).
TEST(ModelParallelCheckpoints, ShardFilesLoadIntoAnotherMeshAndLayoutAndIntoOneProcess) {
  TempDir dir;
  auto run = [&](const std::string& phase, const std::string& mesh, int n, bool other_layout) {
    std::map<std::string, std::string> env = {
        {"KILN_TEST_MESH", mesh}, {"KILN_TEST_PHASE", phase}, {"KILN_TEST_DIR", dir.path()}};
    if (other_layout) env["KILN_TEST_OTHER_LAYOUT"] = "1";
    ASSERT_TRUE(run_job({"/proc/self/exe", "--gtest_filter=ModelParallelCheckpointRank.Run"}, n, env,
                        dir.path() + "/" + phase));
  };
  run("sharded_save", "2", 2, false);
  ASSERT_TRUE(path_exists(dir.path() + "/sharded/index.json"));
  EXPECT_TRUE(path_exists(dir.path() + "/sharded/weights-0.safetensors"));
  EXPECT_TRUE(path_exists(dir.path() + "/sharded/weights-1.safetensors"));
  // One process, no distribution: the same values as the gathered directory.
  auto whole = load_model(dir.path() + "/whole");
  auto single = checkpointed_model();
  load_sharded_weights(*single, dir.path() + "/sharded");
  auto a = whole->weights(), b = single->weights();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i]->value(), b[i]->value())) << a[i]->path();

  run("sharded_load", "2,2", 4, true);
  NamedTensors want;
  add_weights(want, "loaded/", *whole);
  want.emplace_back("loaded/output", (*whole)(checkpoint_data().first).detach());
  for (int r = 0; r < 4; ++r) {
    auto got = load_safetensors(dir.path() + "/out." + std::to_string(r));
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i + 1 < want.size(); ++i)
      EXPECT_TRUE(at::equal(got[i].second, want[i].second)) << "rank " << r << ": " << want[i].first;
    EXPECT_LT((got.back().second - want.back().second).abs().max().item<double>(), kTolerance) << "rank " << r;
  }

  // An interrupted save (no index) is refused, naming the cause.
  std::filesystem::remove(dir.path() + "/sharded/index.json");
  expect_error<FormatError>([&] { load_sharded_weights(*single, dir.path() + "/sharded"); },
                            {"index.json", "interrupted"});
}

// `kiln train` with a model_parallel spec on 2 ranks (mesh (1, 2)) against
// one process: the published version is an ordinary model directory (whole
// variables) that `kiln show` reads, and its weights match the single
// process's to float tolerance.
TEST(ModelParallelCli, TrainSpecOnTwoRanksPublishesAWholeModel) {
  KILN_SKIP_WITHOUT_CLI();
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)";
  TempDir dir;
  auto spec = [&](const std::string& name, const std::string& base, bool sharded) {
    Json s = Json::parse(R"({
      "model": {"layers": [{"class_name": "Dense", "config": {"units": 64, "activation": "relu", "name": "up"}},
                           {"class_name": "Dense", "config": {"units": 32, "activation": "relu", "name": "down"}},
                           {"class_name": "Dense", "config": {"units": 10, "name": "head"}}],
                "input_shape": [784], "name": "mlp"},
      "data": {"source": "fashion_mnist", "scale": "1/255", "flatten": true, "limit": 1024, "test_limit": 500},
      "compile": {"optimizer": "adam", "loss": {"class_name": "SparseCategoricalCrossentropy",
                                                "config": {"from_logits": true}}, "metrics": ["accuracy"]},
      "fit": {"batch_size": 128, "epochs": 2, "seed": 3, "verbose": 2}
    })");
    s["output"] = {{"base_dir", base}};
    if (sharded)
      s["distribution"] = Json::parse(R"({"type": "model_parallel",
          "mesh": {"shape": [1, 2], "axis_names": ["batch", "model"]},
          "layout_map": {"mlp/up/kernel": [null, "model"], "mlp/up/bias": ["model"],
                         "mlp/down/kernel": ["model", null]},
          "batch_dim_name": "batch"})");
    const std::string path = dir.path() + "/" + name;
    std::ofstream(path) << s.dump(2);
    return path;
  };
  const std::string one = dir.path() + "/one", two = dir.path() + "/two";
  auto single = run_command(cli_path() + " --threads 1 train " + spec("one.json", one, false));
  ASSERT_EQ(single.exit_code, 0) << single.output;
  const std::string two_spec = spec("two.json", two, true);
  ASSERT_TRUE(run_job({cli_path(), "train", two_spec}, 2, {}, dir.path() + "/rank"));
  const std::string chief = read_file(dir.path() + "/rank0.log"), other = read_file(dir.path() + "/rank1.log");
  EXPECT_NE(chief.find("Saved model to"), std::string::npos) << chief;
  EXPECT_EQ(other.find("Saved model"), std::string::npos) << other;
  EXPECT_FALSE(path_exists(two + "/2"));  // one version, written once
  auto a = load_safetensors(one + "/1/weights.safetensors"), b = load_safetensors(two + "/1/weights.safetensors");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].first, b[i].first);
    ASSERT_EQ(a[i].second.sizes(), b[i].second.sizes()) << a[i].first;  // whole variables
    EXPECT_LT((a[i].second - b[i].second).abs().max().item<double>(), 1e-4) << a[i].first;
  }
  auto show = run_command(cli_path() + " show " + two + "/1");
  ASSERT_EQ(show.exit_code, 0) << show.output;
  EXPECT_NE(show.output.find("total=52650"), std::string::npos)
      << show.output;  // 784*64+64 + 64*32+32 + 32*10+10: whole
}

}  // namespace
}  // namespace kiln
