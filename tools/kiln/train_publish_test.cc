// `kiln train` and crash leftovers: the BackupAndRestore backup is removed
// only after the trained model is published (a failure or kill in between
// resumes from the last checkpoint instead of training from epoch 1), and
// the staging copy a kill during the publish leaves is removed by the next
// run.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "kiln/core/io.h"
#include "kiln/core/json.h"
#include "kiln/saving/safetensors.h"
#include "kiln/testing/testing.h"

extern char** environ;

namespace kiln {
namespace train_publish_test {  // named: this file shares a unity batch
namespace {

std::string q(const std::string& s) { return "'" + s + "'"; }

CommandResult kiln_cmd(const std::string& args) { return run_command(q(cli_path()) + " " + args); }

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// Three separable classes of 4-feature points.
std::string points_csv(int rows) {
  std::mt19937_64 rng(5);
  std::normal_distribution<double> noise(0.0, 0.3);
  std::ostringstream os;
  os << "f0,f1,f2,f3,label\n";
  for (int i = 0; i < rows; ++i) {
    for (int k = 0; k < 4; ++k) os << (k == i % 3 ? 2.0 : 0.0) + noise(rng) << ",";
    os << i % 3 << "\n";
  }
  return os.str();
}

// A spec training `units`-wide hidden layers for `epochs` epochs with a
// per-epoch BackupAndRestore in `backup`, publishing under `base`.
std::string write_spec(const std::string& dir, const std::string& name, const std::string& base,
                       const std::string& backup, int units, int epochs) {
  const std::string csv = join_path(dir, "points.csv");
  if (!path_exists(csv)) write_text(csv, points_csv(90));
  Json s = Json::parse(R"({
    "data": {"source": "csv", "label": "label"},
    "compile": {"optimizer": {"class_name": "Adam", "config": {"learning_rate": 0.01}},
                "loss": "sparse_categorical_crossentropy", "metrics": ["accuracy"]},
    "fit": {"batch_size": 16, "seed": 3, "verbose": 2}
  })");
  s["model"] = {
      {"layers", Json::array({Json{{"class_name", "Dense"}, {"config", {{"units", units}, {"activation", "relu"}}}},
                              Json{{"class_name", "Dense"}, {"config", {{"units", units}, {"activation", "relu"}}}},
                              Json{{"class_name", "Dense"}, {"config", {{"units", 3}, {"activation", "softmax"}}}}})}};
  s["data"]["path"] = csv;
  s["fit"]["epochs"] = epochs;
  s["callbacks"] = Json::array({Json{{"class_name", "BackupAndRestore"}, {"config", {{"backup_dir", backup}}}}});
  s["output"] = {{"base_dir", base}};
  const std::string p = join_path(dir, name);
  write_text(p, s.dump(2));
  return p;
}

void expect_same_weights(const std::string& a_dir, const std::string& b_dir) {
  auto a = load_safetensors(join_path(a_dir, "weights.safetensors"));
  auto b = load_safetensors(join_path(b_dir, "weights.safetensors"));
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(at::equal(a[i].second, b[i].second)) << a[i].first << " differs";
  }
}

TEST(TrainPublish, BackupOutlivesAFailedPublishAndTheRerunDoesNotRetrain) {
  TempDir tmp;
  const std::string base = join_path(tmp.path(), "models");
  const std::string backup = join_path(tmp.path(), "backup");
  const std::string spec = write_spec(tmp.path(), "spec.json", base, backup, 8, 3);
  // The output base is a file: training finishes, publishing fails.
  write_text(base, "in the way");
  auto failed = kiln_cmd("--threads 1 train " + q(spec));
  ASSERT_EQ(failed.exit_code, 2) << failed.output;
  ASSERT_NE(failed.output.find("Epoch 3/3"), std::string::npos) << failed.output;
  EXPECT_TRUE(is_directory(backup)) << "the backup was deleted before the model was published";

  remove_all(base);
  auto rerun = kiln_cmd("--threads 1 train " + q(spec));
  ASSERT_EQ(rerun.exit_code, 0) << rerun.output;
  EXPECT_EQ(rerun.output.find("Epoch "), std::string::npos) << "the rerun trained again:\n" << rerun.output;
  EXPECT_TRUE(path_exists(join_path(base, "1/model.json")));
  EXPECT_FALSE(path_exists(backup)) << "the backup outlived a successful publish";

  // The same model as a run that never failed.
  const std::string clean_base = join_path(tmp.path(), "clean");
  const std::string clean = write_spec(tmp.path(), "clean.json", clean_base, join_path(tmp.path(), "b2"), 8, 3);
  auto c = kiln_cmd("--threads 1 train " + q(clean));
  ASSERT_EQ(c.exit_code, 0) << c.output;
  expect_same_weights(join_path(base, "1"), join_path(clean_base, "1"));
}

TEST(TrainPublish, KillDuringPublishLeavesNoStagingAndDoesNotRetrain) {
  TempDir tmp;
  const std::string base = join_path(tmp.path(), "models");
  const std::string backup = join_path(tmp.path(), "backup");
  // 2000-wide: about 48 MB to write (weights and Adam's slots), so the
  // publish takes long enough to be killed in the middle.
  const std::string spec = write_spec(tmp.path(), "spec.json", base, backup, 2000, 1);

  std::vector<std::string> argv_s = {cli_path(), "--threads", "1", "train", spec};
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string log = join_path(tmp.path(), "killed.log");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  ASSERT_EQ(posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&fa);

  // Kill as soon as a staging copy of the model exists under the base.
  const std::string mine = "-" + std::to_string(pid) + "-";
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(180);
  bool caught = false, exited = false;
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    if (is_directory(base)) {
      try {
        for (auto& n : list_directory(base))
          if (n[0] == '.' && n.find(mine) != std::string::npos) caught = true;
      } catch (const std::exception&) {
      }
    }
    if (caught) break;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      exited = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (!exited) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  ASSERT_TRUE(caught && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << "the publish was not caught in progress; log:\n"
      << read_file(log);
  std::vector<std::string> left;
  for (auto& n : list_directory(base))
    if (n.find(mine) != std::string::npos) left.push_back(n);
  ASSERT_FALSE(left.empty());
  EXPECT_FALSE(path_exists(join_path(base, "1"))) << "published before the kill";
  EXPECT_TRUE(is_directory(backup)) << "the backup was deleted before the model was published";

  auto rerun = kiln_cmd("--threads 1 train " + q(spec));
  ASSERT_EQ(rerun.exit_code, 0) << rerun.output;
  EXPECT_NE(rerun.output.find("left by a killed run"), std::string::npos) << rerun.output;
  EXPECT_EQ(rerun.output.find("Epoch "), std::string::npos) << "the rerun trained again:\n" << rerun.output;
  for (auto& n : list_directory(base)) EXPECT_EQ(n.find(mine), std::string::npos) << n << " was left behind";
  EXPECT_TRUE(path_exists(join_path(base, "1/model.json")));
  EXPECT_FALSE(path_exists(backup));
}

}  // namespace
}  // namespace train_publish_test
}  // namespace kiln
