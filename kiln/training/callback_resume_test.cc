// Exact resume with stateful callbacks, under real kills: a child process
// (this test binary, re-run on one DISABLED_ test) trains with
// BackupAndRestore and dies by SIGKILL at a chosen batch, in the epoch
// after a callback acted (ReduceLROnPlateau reduced the rate, EarlyStopping
// holds a best, LearningRateScheduler set this epoch's rate). The same
// program run again resumes and must end with weights (and CSV log)
// bit-identical to a run that was never interrupted.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <cstdlib>
#include <limits>

#include "kiln/core/io.h"
#include "kiln/saving/safetensors.h"
#include "kiln/testing/testing.h"
#include "kiln/training/callbacks.h"
#include "kiln/training/checkpoint.h"
#include "kiln/training/training_test_util.h"

extern char** environ;

namespace kiln {
namespace {

using namespace testing_training;

constexpr const char* kScenarioEnv = "KILN_RESUME_CHILD_SCENARIO";
constexpr const char* kDirEnv = "KILN_RESUME_CHILD_DIR";
constexpr const char* kKillEnv = "KILN_RESUME_CHILD_KILL_AT";

// SIGKILLs this process when global batch `at` (0-based, across epochs)
// ends, or (at < 0) when epoch -at-1 ends after its checkpoint was written:
// no unwinding, no destructors, no flushing — what kill -9 does.
class KillSelf : public callbacks::Callback {
 public:
  explicit KillSelf(int64_t at) : at_(at) {}
  void on_train_batch_end(int64_t, const Logs&) override {
    if (seen_++ == at_) ::raise(SIGKILL);
  }
  void on_epoch_end(int epoch, Logs&) override {
    if (at_ < 0 && epoch == -at_ - 1) ::raise(SIGKILL);
  }
  // Runs with the checkpoint writers, after BackupAndRestore saved.
  bool is_checkpointer() const override { return true; }

 private:
  int64_t at_;
  int64_t seen_ = 0;
};

struct Outcome {
  Tensors weights;
  History history;
  std::string csv;
  std::shared_ptr<callbacks::BackupAndRestoreImpl> backup;
  std::shared_ptr<callbacks::EarlyStoppingImpl> early;
  std::shared_ptr<callbacks::ReduceLROnPlateauImpl> plateau;
};

// One "program run" of a scenario: seed, fresh model, fit with the
// scenario's callbacks (72 samples, batch 16, 0.2 validation split: 4
// batches per epoch). `dir` empty: no BackupAndRestore (the reference).
// `kill_at`: see KillSelf.
constexpr int64_t kNoKill = std::numeric_limits<int64_t>::min();

Outcome program(const std::string& scenario, const std::string& dir, const std::string& csv_path,
                int64_t kill_at = kNoKill) {
  set_random_seed(21);
  auto model = make_model(optimizer("Adam", 0.05), /*dropout=*/0.25);
  Problem p = blobs(72, 9);
  FitArgs a;
  a.x = {p.x};
  a.y = {p.y};
  a.batch_size = 16;
  a.validation_split = 0.2;
  a.verbose = 0;
  Outcome out;
  if (!dir.empty()) {
    callbacks::BackupAndRestoreOptions bo;
    if (scenario == "scheduler") bo.save_freq = 3;  // mid-epoch checkpoints
    out.backup = callbacks::BackupAndRestore(dir, bo);
  }
  if (scenario == "plateau") {
    // min_delta 10: nothing improves after epoch 0, so with patience 2 the
    // rate halves at the ends of epochs 2, 4 and 6 — if the patience count
    // survives the kill.
    a.epochs = 7;
    out.plateau = callbacks::ReduceLROnPlateau({.monitor = "loss", .factor = 0.5, .patience = 2, .min_delta = 10.0});
    a.callbacks.push_back(out.plateau);
    a.callbacks.push_back(callbacks::CSVLogger(csv_path));
    a.callbacks.push_back(callbacks::ModelCheckpoint(
        join_path(parent_path(csv_path), "best.safetensors"),
        callbacks::ModelCheckpointOptions{.monitor = "val_loss", .save_best_only = true, .save_weights_only = true}));
  } else if (scenario == "early_stopping") {
    // The highest validation loss is the best ("max"): an early epoch, so
    // the best weights are held across the kill, and training stops after
    // `patience` epochs without a new best.
    a.epochs = 10;
    out.early =
        callbacks::EarlyStopping({.monitor = "val_loss", .patience = 3, .mode = "max", .restore_best_weights = true});
    a.callbacks.push_back(out.early);
    a.callbacks.push_back(callbacks::CSVLogger(csv_path));
  } else if (scenario == "scheduler") {
    a.epochs = 5;
    a.callbacks.push_back(
        callbacks::LearningRateScheduler([](int epoch, double lr) { return epoch == 0 ? lr : lr * 0.6; }));
  } else {
    ADD_FAILURE() << "unknown scenario " << scenario;
  }
  // BackupAndRestore first, as users usually list it: it still saves after
  // the other callbacks acted.
  if (out.backup) a.callbacks.insert(a.callbacks.begin(), out.backup);
  if (kill_at != kNoKill) a.callbacks.push_back(std::make_shared<KillSelf>(kill_at));
  out.history = model->fit(a);
  out.weights = model->get_weights();
  if (!csv_path.empty() && path_exists(csv_path)) out.csv = read_file(csv_path);
  return out;
}

// The child's entry point (run only through run_killed_child).
TEST(CallbackResume, DISABLED_Child) {
  const char* scenario = std::getenv(kScenarioEnv);
  if (!scenario) GTEST_SKIP() << "only run by CallbackResume tests";
  const std::string dir = std::getenv(kDirEnv);
  program(scenario, join_path(dir, "backup"), join_path(dir, "log.csv"), std::atoll(std::getenv(kKillEnv)));
  FAIL() << "the child was not killed";
}

// Runs the scenario in a child process that SIGKILLs itself after global
// batch `kill_at`; expects it to die by SIGKILL.
void run_killed_child(const std::string& scenario, const std::string& dir, int64_t kill_at) {
  std::vector<std::string> env_s;
  for (char** e = environ; *e; ++e) env_s.push_back(*e);
  env_s.push_back(std::string(kScenarioEnv) + "=" + scenario);
  env_s.push_back(std::string(kDirEnv) + "=" + dir);
  env_s.push_back(std::string(kKillEnv) + "=" + std::to_string(kill_at));
  std::vector<std::string> argv_s = {"/proc/self/exe", "--gtest_also_run_disabled_tests",
                                     "--gtest_filter=CallbackResume.DISABLED_Child"};
  std::vector<char*> argv, envp;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  for (auto& s : env_s) envp.push_back(s.data());
  envp.push_back(nullptr);
  const std::string log = join_path(dir, "child.log");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  ASSERT_EQ(rc, 0) << "posix_spawn failed";
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "the child did not die by SIGKILL; its log:\n"
                                                                  << read_file(log);
}

void expect_same(const Outcome& resumed, const Outcome& ref) {
  ASSERT_EQ(resumed.weights.size(), ref.weights.size());
  for (size_t i = 0; i < ref.weights.size(); ++i)
    EXPECT_TRUE(at::equal(resumed.weights[i], ref.weights[i]))
        << "weight " << i << " differs by up to " << (resumed.weights[i] - ref.weights[i]).abs().max().item<double>();
}

TEST(CallbackResume, ReduceLROnPlateauKilledAfterAReductionResumesBitIdentical) {
  TempDir ref_dir, tmp;
  Outcome ref = program("plateau", "", join_path(ref_dir.path(), "log.csv"));
  // The rate halved at the end of epoch 2 (index 2) and again later.
  const auto& lr = ref.history.history["learning_rate"];
  ASSERT_EQ(lr.size(), 7u);
  ASSERT_EQ(lr[3], lr[2] * 0.5);
  ASSERT_LT(lr[6], lr[3]);

  // Killed in epoch 3 (global batch 13 = its second batch); the checkpoint
  // from the end of epoch 2 holds the reduced rate and the patience count.
  run_killed_child("plateau", tmp.path(), 13);
  auto ckpts = list_training_checkpoints(join_path(tmp.path(), "backup"));
  ASSERT_FALSE(ckpts.empty());
  Json st = read_json_file(join_path(ckpts.back(), "training_state.json"));
  EXPECT_EQ(st["epoch"], 3);
  ASSERT_TRUE(st["callbacks"].contains("1")) << st["callbacks"].dump();
  EXPECT_EQ(st["callbacks"]["1"]["name"], "ReduceLROnPlateau");

  Outcome resumed = program("plateau", join_path(tmp.path(), "backup"), join_path(tmp.path(), "log.csv"));
  EXPECT_TRUE(resumed.backup->restored());
  EXPECT_EQ(resumed.backup->restored_epoch(), 3);
  EXPECT_EQ(resumed.history.history["learning_rate"], std::vector<double>(lr.begin() + 3, lr.end()));
  expect_same(resumed, ref);
  // The CSV log of the killed-and-resumed run is the uninterrupted one's.
  EXPECT_EQ(resumed.csv, ref.csv);
  // ModelCheckpoint(save_best_only) kept its best value across the kill:
  // the file it left is the uninterrupted run's best.
  auto a = load_safetensors(join_path(tmp.path(), "best.safetensors"));
  auto b = load_safetensors(join_path(ref_dir.path(), "best.safetensors"));
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i].second, b[i].second)) << a[i].first;
}

TEST(CallbackResume, EarlyStoppingWithBestWeightsKilledLaterResumesBitIdentical) {
  TempDir ref_dir, tmp;
  Outcome ref = program("early_stopping", "", join_path(ref_dir.path(), "log.csv"));
  ASSERT_GT(ref.early->stopped_epoch(), 0) << "the reference run should stop early";
  const int best = ref.early->best_epoch();
  const int kill_epoch = best + 1;
  ASSERT_LT(kill_epoch, ref.early->stopped_epoch());

  // Killed in the epoch after the best one (its third batch).
  run_killed_child("early_stopping", tmp.path(), kill_epoch * 4 + 2);
  Outcome resumed = program("early_stopping", join_path(tmp.path(), "backup"), join_path(tmp.path(), "log.csv"));
  EXPECT_EQ(resumed.backup->restored_epoch(), kill_epoch);
  EXPECT_EQ(resumed.early->best_epoch(), best);
  EXPECT_EQ(resumed.early->stopped_epoch(), ref.early->stopped_epoch());
  expect_same(resumed, ref);
  EXPECT_EQ(resumed.csv, ref.csv);
}

TEST(CallbackResume, EarlyStoppingKilledAfterItStoppedEndsWithoutAnotherEpoch) {
  TempDir ref_dir, tmp;
  Outcome ref = program("early_stopping", "", join_path(ref_dir.path(), "log.csv"));
  const int stopped = ref.early->stopped_epoch();
  ASSERT_GT(stopped, 0);
  // Killed right after the checkpoint of the epoch that told training to
  // stop: the resumed run runs no further epoch, and restores the best
  // weights it kept.
  run_killed_child("early_stopping", tmp.path(), -(stopped + 1));
  Outcome resumed = program("early_stopping", join_path(tmp.path(), "backup"), join_path(tmp.path(), "log.csv"));
  EXPECT_EQ(resumed.backup->restored_epoch(), stopped + 1);
  EXPECT_TRUE(resumed.history.epoch.empty());
  expect_same(resumed, ref);
  EXPECT_EQ(resumed.csv, ref.csv);
}

TEST(CallbackResume, LearningRateSchedulerKilledMidEpochResumesBitIdentical) {
  TempDir tmp;
  Outcome ref = program("scheduler", "", "");
  const auto& lr = ref.history.history["learning_rate"];
  ASSERT_EQ(lr.size(), 5u);
  EXPECT_DOUBLE_EQ(lr[0], 0.05);
  EXPECT_DOUBLE_EQ(lr[2], 0.05 * 0.6 * 0.6);
  // Checkpoints every 3 batches: the last before global batch 10 (epoch 2,
  // batch 2) is after batch 8 (epoch 2, 1 batch done), inside the epoch
  // whose rate the scheduler already set.
  run_killed_child("scheduler", tmp.path(), 10);
  Outcome resumed = program("scheduler", join_path(tmp.path(), "backup"), "");
  EXPECT_EQ(resumed.backup->restored_epoch(), 2);
  EXPECT_EQ(resumed.backup->restored_batch(), 1);
  EXPECT_EQ(resumed.history.history["learning_rate"], std::vector<double>(lr.begin() + 2, lr.end()));
  expect_same(resumed, ref);
}

}  // namespace
}  // namespace kiln
