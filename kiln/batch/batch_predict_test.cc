#include "kiln/batch/batch_predict.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/core/json.h"
#include "kiln/core/random.h"
#include "kiln/layers/dense.h"
#include "kiln/layers/merging.h"
#include "kiln/models/functional.h"
#include "kiln/models/sequential.h"
#include "kiln/testing/testing.h"

namespace kiln::batch {
namespace {

ModelPtr save_mlp(const std::string& dir) {
  set_random_seed(5);
  auto m = models::Sequential();
  m->add(layers::Input({4}));
  m->add(layers::Dense(8, "relu"));
  m->add(layers::Dense(3, "softmax"));
  m->save(dir);
  return m;
}

std::vector<std::string> lines_of(const std::string& path) {
  std::vector<std::string> out;
  std::istringstream in(read_file(path));
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// Every results shard in order, one line per prediction.
std::vector<Json> all_results(const std::string& dir, int64_t n) {
  std::vector<Json> out;
  for (int64_t k = 0; k < n; ++k)
    for (auto& l : lines_of(join_path(dir, shard_file_name("prediction.results", k, n)))) out.push_back(Json::parse(l));
  return out;
}

std::vector<Json> all_errors(const std::string& dir, int64_t n) {
  std::vector<Json> out;
  for (int64_t k = 0; k < n; ++k)
    for (auto& l : lines_of(join_path(dir, shard_file_name("prediction.errors_stats", k, n))))
      out.push_back(Json::parse(l));
  return out;
}

std::string row_json(const at::Tensor& row) {
  Json j = Json::array();
  for (int64_t i = 0; i < row.size(0); ++i) j.push_back(row[i].item<double>());
  return j.dump();
}

TEST(BatchPredict, ShardsKeepInputOrderAndBadLinesGoToErrorFiles) {
  TempDir dir;
  auto model = save_mlp(dir.path() + "/m");
  auto x = at::randn({9, 4});
  // a.jsonl: rows 0-4 with a bad line and a blank one; b.jsonl: rows 5-8, one TF-style.
  std::string a, b;
  for (int i = 0; i < 5; ++i) {
    a += row_json(x[i]) + "\n";
    if (i == 1) a += "[1, 2, 3]\n";  // wrong width: line 3
    if (i == 2) a += "\n";           // blank: line 5, skipped
  }
  for (int i = 5; i < 9; ++i) b += (i == 6 ? "{\"inputs\": " + row_json(x[i]) + "}" : row_json(x[i])) + "\n";
  b += "{not json";  // line 5 of b, no trailing newline
  make_dirs(dir.path() + "/in");
  atomic_write_file(dir.path() + "/in/a.jsonl", a);
  atomic_write_file(dir.path() + "/in/b.jsonl", b);

  BatchPredictOptions o;
  o.model_dir = dir.path() + "/m";
  o.inputs = {dir.path() + "/in/*.jsonl"};
  o.output_dir = dir.path() + "/out";
  o.workers = 3;
  o.batch_size = 2;
  o.lines_per_shard = 4;  // 12 lines -> 3 shards
  auto r = batch_predict(o);
  EXPECT_EQ(r.num_shards, 3);
  EXPECT_EQ(r.shards_written, 3);
  EXPECT_EQ(r.predictions, 9);
  EXPECT_EQ(r.errors, 2);

  auto results = all_results(o.output_dir, 3);
  ASSERT_EQ(results.size(), 9u);
  auto want = model->predict(x);
  for (int i = 0; i < 9; ++i) {
    auto inst = results[i]["instance"];
    if (inst.is_object()) inst = inst["inputs"];
    EXPECT_EQ(inst, Json::parse(row_json(x[i]))) << i;  // input order
    auto p = results[i]["prediction"];
    ASSERT_EQ(p.size(), 3u);
    for (int k = 0; k < 3; ++k) EXPECT_FLOAT_EQ(p[k].get<float>(), want[i][k].item<float>());
  }
  auto errors = all_errors(o.output_dir, 3);
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_EQ(errors[0]["line"], 3);
  EXPECT_NE(errors[0]["file"].get<std::string>().find("a.jsonl"), std::string::npos);
  EXPECT_NE(errors[0]["error"].get<std::string>().find("has shape (3,) but the model expects (4,)"), std::string::npos)
      << errors[0]["error"];
  EXPECT_EQ(errors[1]["line"], 5);
  EXPECT_EQ(errors[1]["instance"], "{not json");
  // Nothing but the shards (no temporary files).
  EXPECT_EQ(list_directory(o.output_dir).size(), 6u);
}

TEST(BatchPredict, NamedInputsOfAFunctionalModelAndMultipleOutputs) {
  TempDir dir;
  auto a = layers::Input({2}, at::kFloat, "a");
  auto b = layers::Input({2}, at::kFloat, "b");
  auto sum = layers::Add()(KerasTensors{a, b});
  auto y1 = layers::Dense(1)(sum);
  auto model = models::Functional(KerasTensors{a, b}, KerasTensors{y1[0], sum[0]});
  model->save(dir.path() + "/f");
  atomic_write_file(dir.path() + "/in.jsonl",
                    "{\"a\": [1, 2], \"b\": [3, 4]}\n{\"inputs\": {\"b\": [0, 0], \"a\": [1, 1]}}\n{\"a\": [1, 2]}\n");
  BatchPredictOptions o;
  o.model_dir = dir.path() + "/f";
  o.inputs = {dir.path() + "/in.jsonl"};
  o.output_dir = dir.path() + "/out";
  auto r = batch_predict(o);
  EXPECT_EQ(r.num_shards, 1);
  auto results = all_results(o.output_dir, 1);
  ASSERT_EQ(results.size(), 2u);
  auto names = model->output_names();
  EXPECT_EQ(results[0]["prediction"][names[1]], Json::parse("[4.0, 6.0]"));
  EXPECT_EQ(results[1]["prediction"][names[1]], Json::parse("[1.0, 1.0]"));
  auto errors = all_errors(o.output_dir, 1);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0]["error"].get<std::string>().find("input 'b' is missing"), std::string::npos);
}

TEST(BatchPredict, RerunSkipsFinishedShardsAndRefusesAnotherShardCount) {
  TempDir dir;
  save_mlp(dir.path() + "/m");
  std::string in;
  for (int i = 0; i < 10; ++i) in += "[" + std::to_string(i) + ", 1, 2, 3]\n";
  atomic_write_file(dir.path() + "/in.jsonl", in);
  BatchPredictOptions o;
  o.model_dir = dir.path() + "/m";
  o.inputs = {dir.path() + "/in.jsonl"};
  o.output_dir = dir.path() + "/out";
  o.lines_per_shard = 5;
  EXPECT_EQ(batch_predict(o).shards_written, 2);
  const std::string shard1 = join_path(o.output_dir, shard_file_name("prediction.results", 1, 2));
  remove_all(shard1);
  atomic_write_file(join_path(o.output_dir, ".prediction.results-00001-of-00002.tmp-dead"), "half");
  auto r = batch_predict(o);
  EXPECT_EQ(r.shards_skipped, 1);
  EXPECT_EQ(r.shards_written, 1);
  EXPECT_EQ(all_results(o.output_dir, 2).size(), 10u);
  EXPECT_EQ(list_directory(o.output_dir).size(), 4u);  // the stale temporary is gone
  o.lines_per_shard = 3;
  try {
    batch_predict(o);
    FAIL() << "a directory of 2 shards was reused for 4";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("another number of shards"), std::string::npos) << e.what();
  }
  o.workers = 0;
  EXPECT_THROW(batch_predict(o), ValueError);
  o.workers = 1;
  o.inputs = {dir.path() + "/nothing-*.jsonl"};
  EXPECT_THROW(batch_predict(o), NotFoundError);
}

// kill -9 in the middle of a CLI run, then re-run: finished shards are kept
// byte for byte (same mtime), the rest are written, the whole is in order.
TEST(BatchPredictCli, SurvivesKillNineAndResumes) {
  TempDir dir;
  save_mlp(dir.path() + "/m");
  std::string in;
  const int kLines = 40;
  for (int i = 0; i < kLines; ++i) in += "[" + std::to_string(i) + ", 0.5, -1, 2]\n";
  atomic_write_file(dir.path() + "/in.jsonl", in);
  const std::string out = dir.path() + "/out";
  const int64_t n = 20;  // 2 lines per shard

  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setenv("KILN_BATCH_PREDICT_TEST_DELAY_MS", "150", 1);
    freopen("/dev/null", "w", stdout);
    execl(cli_path().c_str(), "kiln", "batch-predict", "--model", (dir.path() + "/m").c_str(), "--input",
          (dir.path() + "/in.jsonl").c_str(), "--output", out.c_str(), "--lines_per_shard", "2", "--threads", "1",
          (char*)nullptr);
    _exit(127);
  }
  auto count_done = [&] {
    int c = 0;
    for (int64_t k = 0; k < n; ++k)
      if (path_exists(join_path(out, shard_file_name("prediction.results", k, n)))) ++c;
    return c;
  };
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (count_done() < 3 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the run ended before it could be killed";
  const int finished = count_done();
  ASSERT_GE(finished, 3);
  ASSERT_LT(finished, n) << "every shard was done before the kill";

  std::map<std::string, std::pair<struct timespec, std::string>> kept;
  for (auto& name : list_directory(out)) {
    if (name.rfind("prediction.", 0) != 0) continue;
    struct stat st;
    ASSERT_EQ(stat(join_path(out, name).c_str(), &st), 0);
    kept[name] = {st.st_mtim, read_file(join_path(out, name))};
  }
  auto res = run_command("'" + cli_path() + "' batch-predict --model '" + dir.path() + "/m' --input '" + dir.path() +
                         "/in.jsonl' --output '" + out + "' --lines_per_shard 2 --workers 2 --threads 1");
  ASSERT_EQ(res.exit_code, 0) << res.output;
  EXPECT_NE(res.output.find(std::to_string(n - finished) + " written"), std::string::npos) << res.output;
  for (auto& [name, before] : kept) {
    struct stat st;
    ASSERT_EQ(stat(join_path(out, name).c_str(), &st), 0);
    EXPECT_EQ(st.st_mtim.tv_sec, before.first.tv_sec) << name;
    EXPECT_EQ(st.st_mtim.tv_nsec, before.first.tv_nsec) << name;
    EXPECT_EQ(read_file(join_path(out, name)), before.second) << name;
  }
  auto results = all_results(out, n);
  ASSERT_EQ(results.size(), (size_t)kLines);
  for (int i = 0; i < kLines; ++i) EXPECT_EQ(results[i]["instance"][0], i);
  for (auto& name : list_directory(out)) EXPECT_EQ(name.find(".tmp-"), std::string::npos) << name;
}

TEST(BatchPredictCli, UserErrorsAreOneLineExitTwo) {
  TempDir dir;
  auto res = run_command("'" + cli_path() + "' batch-predict --model '" + dir.path() + "' --input '" + dir.path() +
                         "/none*.jsonl' --output '" + dir.path() + "/o' 2>&1");
  EXPECT_EQ(res.exit_code, 2);
  EXPECT_NE(res.output.find("kiln: error: --input"), std::string::npos) << res.output;
  EXPECT_NE(res.output.find("matches no file"), std::string::npos) << res.output;
}

}  // namespace
}  // namespace kiln::batch
