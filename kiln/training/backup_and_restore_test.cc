#include <gtest/gtest.h>

#include <fstream>

#include "kiln/core/device.h"
#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/testing/testing.h"
#include "kiln/training/callbacks.h"
#include "kiln/training/checkpoint.h"
#include "kiln/training/training_test_util.h"

namespace kiln {
namespace {

using namespace testing_training;

struct Interrupted : std::runtime_error {
  Interrupted() : std::runtime_error("simulated crash") {}
};

// Throws after the global batch `at_batch` (0-based, counted across epochs)
// ends, or when epoch `at_epoch` begins: a process dying at that moment.
class Crash : public callbacks::Callback {
 public:
  Crash(int64_t at_batch, int at_epoch = -1) : at_batch_(at_batch), at_epoch_(at_epoch) {}
  void on_epoch_begin(int epoch, const Logs&) override {
    if (epoch == at_epoch_) throw Interrupted();
  }
  void on_train_batch_end(int64_t, const Logs&) override {
    if (seen_++ == at_batch_) throw Interrupted();
  }

 private:
  int64_t at_batch_;
  int at_epoch_;
  int64_t seen_ = 0;
};

struct RunResult {
  Tensors weights;
  History history;
  std::shared_ptr<callbacks::BackupAndRestoreImpl> backup;
};

enum class Source { kTensors, kDataset };

// One "program run": seed, fresh model, fit 4 epochs (72 samples, batch 16:
// 4 training batches per epoch after a 0.2 validation split). Adam, dropout
// and shuffling exercise optimizer slots, the LibTorch generator and the
// host RNG.
RunResult program(const std::string& backup_dir, callbacks::BackupAndRestoreOptions opt, CallbackPtr crash = nullptr,
                  Source input = Source::kTensors) {
  set_random_seed(21);
  auto model = make_model(optimizer("Adam", 0.02), /*dropout=*/0.25);
  Problem p = blobs(72, 9);
  FitArgs a;
  a.epochs = 4;
  a.verbose = 0;
  if (input == Source::kTensors) {
    a.x = {p.x};
    a.y = {p.y};
    a.batch_size = 16;
    a.validation_split = 0.2;
  } else {
    a.dataset = data::Dataset::from_tensor_slices({p.x, p.y}).shuffle(72).batch(12);
    a.validation_x = {p.x.narrow(0, 0, 20)};
    a.validation_y = {p.y.narrow(0, 0, 20)};
  }
  RunResult r;
  if (!backup_dir.empty()) {
    r.backup = callbacks::BackupAndRestore(backup_dir, opt);
    a.callbacks.push_back(r.backup);
  }
  if (crash) a.callbacks.push_back(crash);
  r.history = model->fit(a);
  r.weights = model->get_weights();
  return r;
}

RunResult reference(Source input = Source::kTensors) { return program("", {}, nullptr, input); }

TEST(BackupAndRestore, ResumesMidEpochBitIdentical) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/backup";
  RunResult ref = reference();
  ASSERT_EQ(ref.history.history["loss"].size(), 4u);

  // Dies after global batch 6 (epoch 1, batch 2); the last save was after
  // global batch 5 (every 3 batches: 2, 5).
  EXPECT_THROW(program(dir, {.save_freq = 3}, std::make_shared<Crash>(6)), Interrupted);
  ASSERT_EQ(list_training_checkpoints(dir).size(), 2u);

  RunResult resumed = program(dir, {.save_freq = 3});
  EXPECT_TRUE(resumed.backup->restored());
  EXPECT_EQ(resumed.backup->restored_epoch(), 1);
  EXPECT_EQ(resumed.backup->restored_batch(), 2);
  EXPECT_TRUE(same_weights(resumed.weights, ref.weights));
  // The resumed epoch's logs include the batches run before the crash.
  ASSERT_EQ(resumed.history.history["loss"].size(), 3u);
  EXPECT_EQ(resumed.history.epoch.front(), 1);
  EXPECT_EQ(resumed.history.history["loss"][0], ref.history.history["loss"][1]);
  EXPECT_EQ(resumed.history.history["val_loss"][2], ref.history.history["val_loss"][3]);
  EXPECT_FALSE(path_exists(dir));  // delete_checkpoint after a finished run
}

TEST(BackupAndRestore, ResumesAtAnEpochBoundaryBitIdentical) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/backup";
  RunResult ref = reference();
  EXPECT_THROW(program(dir, {}, std::make_shared<Crash>(-1, /*at_epoch=*/2)), Interrupted);
  RunResult resumed = program(dir, {});
  EXPECT_EQ(resumed.backup->restored_epoch(), 2);
  EXPECT_EQ(resumed.backup->restored_batch(), 0);
  EXPECT_TRUE(same_weights(resumed.weights, ref.weights));
  EXPECT_EQ(resumed.history.epoch, (std::vector<int>{2, 3}));
  EXPECT_EQ(resumed.history.history["loss"],
            (std::vector<double>(ref.history.history["loss"].begin() + 2, ref.history.history["loss"].end())));
}

TEST(BackupAndRestore, SurvivesRepeatedCrashesAtManyPoints) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/backup";
  RunResult ref = reference();
  // Each run dies a little later than the one before resumed from; the
  // crash right after a save (batch 3) and right at an epoch's last batch
  // (batch 7) are included.
  for (int64_t at : {3, 2, 5, 0, 1})
    EXPECT_THROW(program(dir, {.save_freq = 2}, std::make_shared<Crash>(at)), Interrupted);
  RunResult resumed = program(dir, {.save_freq = 2});
  EXPECT_TRUE(resumed.backup->restored());
  EXPECT_TRUE(same_weights(resumed.weights, ref.weights));
}

TEST(BackupAndRestore, DatasetInputResumesMidEpoch) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/backup";
  RunResult ref = reference(Source::kDataset);  // 6 batches per epoch
  EXPECT_THROW(program(dir, {.save_freq = 4}, std::make_shared<Crash>(9), Source::kDataset), Interrupted);
  RunResult resumed = program(dir, {.save_freq = 4}, nullptr, Source::kDataset);
  EXPECT_EQ(resumed.backup->restored_epoch(), 1);
  EXPECT_EQ(resumed.backup->restored_batch(), 2);
  EXPECT_TRUE(same_weights(resumed.weights, ref.weights));
}

TEST(BackupAndRestore, AFinishedRunKeptOnDiskIsANoOpToRerun) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/backup";
  RunResult first = program(dir, {.delete_checkpoint = false});
  ASSERT_TRUE(path_exists(dir));
  RunResult again = program(dir, {.delete_checkpoint = false});
  EXPECT_EQ(again.backup->restored_epoch(), 4);
  EXPECT_TRUE(again.history.epoch.empty());
  EXPECT_TRUE(same_weights(first.weights, again.weights));
}

void truncate_file(const std::string& path, size_t keep) {
  std::string data = read_file(path);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << data.substr(0, keep);
}

void flip_byte(const std::string& path, size_t from_end) {
  std::string data = read_file(path);
  data[data.size() - from_end] ^= 0x5a;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << data;
}

TEST(BackupAndRestore, CorruptNewestCheckpointFallsBackToThePreviousOne) {
  RunResult ref = reference();
  struct Damage {
    std::string file;
    std::function<void(const std::string&)> apply;
  };
  std::vector<Damage> damages{
      {"weights.safetensors", [](const std::string& p) { truncate_file(p, 100); }},
      {"optimizer.safetensors", [](const std::string& p) { flip_byte(p, 3); }},
      {"training_state.json", [](const std::string& p) { truncate_file(p, 40); }},
      {"metrics.safetensors", [](const std::string& p) { remove_all(p); }},
  };
  for (auto& d : damages) {
    TempDir tmp;
    const std::string dir = tmp.path() + "/backup";
    EXPECT_THROW(program(dir, {.save_freq = 3}, std::make_shared<Crash>(10)), Interrupted);
    auto ckpts = list_training_checkpoints(dir);
    ASSERT_EQ(ckpts.size(), 2u);
    d.apply(join_path(ckpts.back(), d.file));
    ::testing::internal::CaptureStderr();
    RunResult resumed = program(dir, {.save_freq = 3});
    std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("ignoring checkpoint"), std::string::npos) << d.file << ": " << err;
    // Kept saves: after global batches 5 and 8. The damaged one is 8
    // (epoch 2, 1 batch done), so the run resumes from 5 (epoch 1, 2 done).
    EXPECT_EQ(resumed.backup->restored_epoch(), 1) << d.file;
    EXPECT_EQ(resumed.backup->restored_batch(), 2) << d.file;
    EXPECT_TRUE(same_weights(resumed.weights, ref.weights)) << d.file;
  }
}

TEST(BackupAndRestore, AllCheckpointsCorruptIsAClearError) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/backup";
  EXPECT_THROW(program(dir, {.save_freq = 3}, std::make_shared<Crash>(10)), Interrupted);
  for (auto& c : list_training_checkpoints(dir)) truncate_file(join_path(c, "weights.safetensors"), 7);
  ::testing::internal::CaptureStderr();
  try {
    program(dir, {.save_freq = 3});
    FAIL() << "expected FormatError";
  } catch (const FormatError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("no valid checkpoint in " + dir), std::string::npos) << m;
    EXPECT_NE(m.find("weights.safetensors"), std::string::npos) << m;
  }
  ::testing::internal::GetCapturedStderr();
}

TEST(BackupAndRestore, AHalfWrittenCheckpointIsIgnoredAndCleanedUp) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/backup";
  RunResult ref = reference();
  EXPECT_THROW(program(dir, {.save_freq = 3}, std::make_shared<Crash>(4)), Interrupted);
  // What a kill -9 during AtomicDirectory's assembly leaves behind.
  const std::string partial = join_path(dir, ".ckpt-000000000099.tmp-deadbeef");
  make_dirs(partial);
  atomic_write_file(join_path(partial, "weights.safetensors"), "garbage");
  RunResult resumed = program(dir, {.save_freq = 3, .delete_checkpoint = false});
  EXPECT_EQ(resumed.backup->restored_epoch(), 0);
  EXPECT_EQ(resumed.backup->restored_batch(), 3);
  EXPECT_TRUE(same_weights(resumed.weights, ref.weights));
  EXPECT_FALSE(path_exists(partial));
}

TEST(BackupAndRestore, CheckpointRecordsTheTrainingState) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/backup";
  EXPECT_THROW(program(dir, {.save_freq = 3}, std::make_shared<Crash>(3)), Interrupted);
  auto ckpts = list_training_checkpoints(dir);
  ASSERT_EQ(ckpts.size(), 1u);
  Json st = read_json_file(join_path(ckpts[0], "training_state.json"));
  EXPECT_EQ(st["format"], "kiln.training_state");
  EXPECT_EQ(st["epoch"], 0);
  EXPECT_EQ(st["batch"], 3);
  EXPECT_EQ(st["iterations"], 3);
  EXPECT_EQ(st["data_position"]["batches_done"], 3);
  EXPECT_FALSE(st["host_rng"].get<std::string>().empty());
  EXPECT_NE(st["host_rng"], st["host_rng_epoch_start"]);  // the shuffle drew from it
  EXPECT_GT(st["torch_rng"].get<std::string>().size(), 1000u);
  EXPECT_FALSE(st.contains("cuda_rng")) << "trained on the CPU";
  for (const char* f : {"weights.safetensors", "optimizer.safetensors", "metrics.safetensors"})
    EXPECT_EQ(st["files"][f]["bytes"].get<int64_t>(), (int64_t)read_file(join_path(ckpts[0], f)).size()) << f;
}

// On a GPU, dropout draws from the GPU's generator: the checkpoint keeps
// its state too, or the resumed run's masks (and weights) would differ.
TEST(BackupAndRestoreCUDA, ResumesMidEpochOnTheGpuBitIdentical) {
  DeviceScope gpu("cuda:0");
  TempDir tmp;
  const std::string dir = tmp.path() + "/backup";
  RunResult ref = reference();
  EXPECT_THROW(program(dir, {.save_freq = 3}, std::make_shared<Crash>(6)), Interrupted);
  auto ckpts = list_training_checkpoints(dir);
  ASSERT_EQ(ckpts.size(), 2u);
  EXPECT_TRUE(read_json_file(join_path(ckpts.back(), "training_state.json")).contains("cuda_rng"));
  RunResult resumed = program(dir, {.save_freq = 3});
  ASSERT_TRUE(resumed.backup->restored());
  for (const auto& w : resumed.weights) EXPECT_TRUE(w.is_cuda());
  EXPECT_TRUE(same_weights(resumed.weights, ref.weights));
}

TEST(BackupAndRestore, RngStateHelpersRoundTrip) {
  set_random_seed(3);
  std::string h = host_rng_state();
  at::Tensor t = torch_rng_state();
  uint64_t a = host_rng()();
  at::Tensor ra = at::rand({4});
  set_host_rng_state(h);
  set_torch_rng_state(t);
  EXPECT_EQ(host_rng()(), a);
  EXPECT_TRUE(at::equal(at::rand({4}), ra));
  EXPECT_THROW(set_host_rng_state("not a state"), FormatError);
  EXPECT_FALSE(cuda_rng_state(at::Device(at::kCPU)).defined());
  set_cuda_rng_state(at::Device(at::kCPU), t);  // nothing to restore on the CPU
}

}  // namespace
}  // namespace kiln
