// Parameter-server foundations: roles from TF_CONFIG and variable partitioning.
#include <gtest/gtest.h>

#include <map>

#include "kiln/core/error.h"
#include "kiln/distribute/cluster.h"
#include "kiln/distribute/partitioner.h"
#include "kiln/testing/expect_error.h"

namespace kiln {
// Named, not anonymous: the unity build compiles this file with the other
// distribute tests, which have helpers of the same names.
namespace ps_foundation_test {

using distribute::PsClusterSpec;
using distribute::resolve_ps_cluster;

distribute::GetEnv tf_config(const std::string& json) {
  return [json](const std::string& k) -> std::optional<std::string> {
    if (k == "TF_CONFIG") return json;
    return std::nullopt;
  };
}

const std::string kCluster =
    R"({"cluster": {"chief": ["h0:2222"], "worker": ["h1:2222", "h2:2222", "h3:2222"],
                    "ps": ["h4:2222", "h5:2222"], "evaluator": ["h6:2222"]},)";

TEST(PsCluster, RolesAndAddressesFromTfConfig) {
  PsClusterSpec ps = resolve_ps_cluster(tf_config(kCluster + R"("task": {"type": "ps", "index": 1}})"));
  EXPECT_TRUE(ps.is_ps());
  EXPECT_EQ(ps.task_index, 1);
  EXPECT_EQ(ps.address(), "h5:2222");
  EXPECT_EQ(ps.num_ps(), 2);
  EXPECT_EQ(ps.num_workers(), 3);
  EXPECT_EQ(ps.chief, std::vector<std::string>{"h0:2222"});
  EXPECT_EQ(ps.worker, (std::vector<std::string>{"h1:2222", "h2:2222", "h3:2222"}));
  EXPECT_EQ(ps.ps, (std::vector<std::string>{"h4:2222", "h5:2222"}));
  EXPECT_EQ(ps.evaluator, std::vector<std::string>{"h6:2222"});

  PsClusterSpec w = resolve_ps_cluster(tf_config(kCluster + R"("task": {"type": "worker", "index": 2}})"));
  EXPECT_TRUE(w.is_worker());
  EXPECT_EQ(w.address(), "h3:2222");
  PsClusterSpec chief = resolve_ps_cluster(tf_config(kCluster + R"("task": {"type": "chief", "index": 0}})"));
  EXPECT_TRUE(chief.is_chief());
  EXPECT_EQ(chief.address(), "h0:2222");
  PsClusterSpec ev = resolve_ps_cluster(tf_config(kCluster + R"("task": {"type": "evaluator", "index": 0}})"));
  EXPECT_TRUE(ev.is_evaluator());

  // No chief (allowed) and no evaluator.
  PsClusterSpec nc = resolve_ps_cluster(
      tf_config(R"({"cluster": {"worker": ["a:1"], "ps": ["a:2"]}, "task": {"type": "worker", "index": 0}})"));
  EXPECT_TRUE(nc.chief.empty());
  EXPECT_EQ(nc.num_ps(), 1);

  EXPECT_TRUE(distribute::is_ps_cluster(tf_config(kCluster + R"("task": {"type": "ps", "index": 0}})")));
  EXPECT_FALSE(distribute::is_ps_cluster(
      tf_config(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}})")));
  EXPECT_FALSE(distribute::is_ps_cluster(tf_config("{oops")));
  EXPECT_FALSE(distribute::is_ps_cluster([](const std::string&) { return std::nullopt; }));
}

TEST(PsCluster, DataParallelResolverGivesPsJobsNoRank) {
  // The data-parallel resolver refuses a parameter-server cluster for every
  // task (a ps must not become a data-parallel rank), pointing to the fix.
  for (const char* task : {R"("task": {"type": "ps", "index": 0}})", R"("task": {"type": "worker", "index": 0}})",
                           R"("task": {"type": "chief", "index": 0}})"})
    expect_error<ValueError>([&] { distribute::resolve_cluster(tf_config(kCluster + task)); },
                             {"TF_CONFIG", "'ps'", "parameter-server", "resolve_ps_cluster"});
  // Chief + workers stay data-parallel ranks, as before.
  auto c = distribute::resolve_cluster(
      tf_config(R"({"cluster": {"chief": ["a:1"], "worker": ["b:1"]}, "task": {"type": "worker", "index": 0}})"));
  EXPECT_EQ(c.rank, 1);
  EXPECT_EQ(c.world_size, 2);
}

TEST(PsCluster, BadTfConfigIsOneClearError) {
  auto err = [](const std::string& json) { return [json] { resolve_ps_cluster(tf_config(json)); }; };
  expect_error<ValueError>([] { resolve_ps_cluster([](const std::string&) { return std::nullopt; }); },
                           {"TF_CONFIG", "\"ps\"", "docs/DISTRIBUTED.md"});
  expect_error<ValueError>(err("{oops"), {"TF_CONFIG", "JSON"});
  expect_error<ValueError>(err(R"({"cluster": {"worker": ["a:1"]}})"), {"TF_CONFIG", "\"task\""});
  expect_error<ValueError>(err(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}})"),
                           {"TF_CONFIG", "\"ps\"", "resolve_cluster"});
  expect_error<ValueError>(err(R"({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 0}})"), {"\"worker\""});
  expect_error<ValueError>(err(R"({"cluster": {"chief": ["a:1", "a:2"], "worker": ["a:3"], "ps": ["a:4"]},
                     "task": {"type": "ps", "index": 0}})"),
                           {"cluster.chief", "at most one", "2"});
  expect_error<ValueError>(err(R"({"cluster": {"worker": ["a:1"], "ps": ["a:2"], "master": ["a:3"]},
                     "task": {"type": "ps", "index": 0}})"),
                           {"'master'", "\"ps\""});
  expect_error<ValueError>(err(R"({"cluster": {"worker": ["a:1"], "ps": ["a"]}, "task": {"type": "ps", "index": 0}})"),
                           {"cluster.ps[0]", "host:port"});
  expect_error<ValueError>(
      err(R"({"cluster": {"worker": ["a:1"], "ps": ["a:x"]}, "task": {"type": "ps", "index": 0}})"),
      {"cluster.ps[0] port", "'x'"});
  expect_error<ValueError>(
      err(R"({"cluster": {"worker": ["a:1"], "ps": ["a:2", "a:1"]}, "task": {"type": "ps", "index": 0}})"),
      {"cluster.ps[1]", "cluster.worker[0]", "a:1", "own port"});
  expect_error<ValueError>(
      err(R"({"cluster": {"worker": ["a:1"], "ps": ["a:2"]}, "task": {"type": "ps", "index": 1}})"),
      {"'ps'", "index 1", "not in the cluster", "lists 1"});
  expect_error<ValueError>(
      err(R"({"cluster": {"worker": ["a:1"], "ps": ["a:2"]}, "task": {"type": "ps", "index": -1}})"),
      {"index -1", "not in the cluster"});
  expect_error<ValueError>(
      err(R"({"cluster": {"worker": ["a:1"], "ps": ["a:2"]}, "task": {"type": "master", "index": 0}})"),
      {"'master'", "\"evaluator\""});
  expect_error<ValueError>(err(R"({"cluster": {"worker": ["a:1"], "ps": ["a:2"]}, "task": {"type": "ps"}})"),
                           {"task must be", "\"index\""});
  expect_error<ValueError>(err(R"({"cluster": {"worker": "a:1", "ps": ["a:2"]}, "task": {"type": "ps", "index": 0}})"),
                           {"cluster.worker", "list"});
}

// --- partitioners and placement ---------------------------------------------------------

using distribute::FixedShardsPartitioner;
using distribute::MaxSizePartitioner;
using distribute::MinSizePartitioner;
using distribute::place_variables;

TEST(Partitioner, MinSizeAsTensorFlow) {
  // TF's documented examples: float32 (6, 1) is 24 bytes.
  EXPECT_EQ(MinSizePartitioner({.min_shard_bytes = 4, .max_shards = 2}).num_shards({6, 1}, 4), 2);
  EXPECT_EQ(MinSizePartitioner({.min_shard_bytes = 4, .max_shards = 10}).num_shards({6, 1}, 4), 6);
  // ceil(bytes / min_shard_bytes): 1024x1024 float32 over 256 KiB is 16.
  EXPECT_EQ(MinSizePartitioner({.min_shard_bytes = 256 << 10, .max_shards = 100}).num_shards({1024, 1024}, 4), 16);
  EXPECT_EQ(MinSizePartitioner({.min_shard_bytes = 10, .max_shards = 100}).num_shards({5, 1}, 4), 2);  // 20 B
  EXPECT_EQ(MinSizePartitioner({.min_shard_bytes = 11, .max_shards = 100}).num_shards({5, 1}, 4), 2);  // ceil(20/11)
  EXPECT_EQ(MinSizePartitioner({.min_shard_bytes = 1 << 20, .max_shards = 8}).num_shards({100, 10}, 4), 1);
  // Never more shards than rows, and defaults (256 KiB, 1 shard) never split.
  EXPECT_EQ(MinSizePartitioner({.min_shard_bytes = 1, .max_shards = 64}).num_shards({3, 1000}, 4), 3);
  EXPECT_EQ(MinSizePartitioner({}).num_shards({100000, 64}, 4), 1);
  EXPECT_EQ(MinSizePartitioner({.min_shard_bytes = 1, .max_shards = 4}).num_shards({}, 4), 1);  // scalar
  // bfloat16 halves the bytes.
  EXPECT_EQ(MinSizePartitioner({.min_shard_bytes = 8, .max_shards = 100}).num_shards({8, 1}, 2), 2);
}

TEST(Partitioner, FixedAndMaxSizeAsTensorFlow) {
  EXPECT_EQ(FixedShardsPartitioner({.num_shards = 2}).num_shards({10, 3}, 4), 2);
  EXPECT_EQ(FixedShardsPartitioner({.num_shards = 5}).num_shards({3, 3}, 4), 3);
  EXPECT_EQ(MaxSizePartitioner({.max_shard_bytes = 4}).num_shards({6, 1}, 4), 6);
  EXPECT_EQ(MaxSizePartitioner({.max_shard_bytes = 4, .max_shards = 2}).num_shards({6, 1}, 4), 2);
  EXPECT_EQ(MaxSizePartitioner({.max_shard_bytes = 1024}).num_shards({6, 1}, 4), 1);
  EXPECT_EQ(MaxSizePartitioner({.max_shard_bytes = 1}).num_shards({4, 8}, 4), 4);  // a shard holds a row at least
}

TEST(Partitioner, OptionsAreValidated) {
  expect_error<ValueError>([] { MinSizePartitioner({.min_shard_bytes = 0}); },
                           {"min_shard_bytes", "min_shard_bytes=0"});
  expect_error<ValueError>([] { MinSizePartitioner({.max_shards = 0}); }, {"max_shards", "max_shards=0"});
  expect_error<ValueError>([] { FixedShardsPartitioner({.num_shards = -1}); }, {"num_shards=-1"});
  expect_error<ValueError>([] { MaxSizePartitioner({.max_shard_bytes = 0}); }, {"max_shard_bytes=0"});
  expect_error<ValueError>([] { MaxSizePartitioner({.max_shard_bytes = 1, .max_shards = -2}); }, {"max_shards=-2"});
}

TEST(Partitioner, ShardRowsPutTheRemainderFirst) {
  EXPECT_EQ(distribute::shard_rows(10, 3), (std::vector<int64_t>{4, 3, 3}));
  EXPECT_EQ(distribute::shard_rows(6, 2), (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(distribute::shard_rows(5, 5), (std::vector<int64_t>{1, 1, 1, 1, 1}));
}

TEST(Placement, RoundRobinInCreationOrder) {
  auto placed = place_variables(
      {{"a/kernel", {4, 3}}, {"a/bias", {3}}, {"b/kernel", {3, 2}}, {"b/bias", {2}}, {"c/kernel", {2, 2}}}, 2);
  ASSERT_EQ(placed.size(), 5u);
  const std::vector<int> expected = {0, 1, 0, 1, 0};  // variable i -> ps i mod 2
  for (size_t i = 0; i < placed.size(); ++i) {
    ASSERT_EQ(placed[i].shards.size(), 1u);
    EXPECT_FALSE(placed[i].sharded());
    EXPECT_EQ(placed[i].shards[0].ps, expected[i]) << placed[i].path;
    EXPECT_EQ(placed[i].shards[0].path, placed[i].path);
    EXPECT_EQ(placed[i].shards[0].shape, placed[i].shape);
  }
  // One ps holds everything.
  for (auto& p : place_variables({{"x", {2}}, {"y", {2}}}, 1)) EXPECT_EQ(p.shards[0].ps, 0);
}

TEST(Placement, LargeVariablesAreShardedRoundRobin) {
  // 10 rows of 4 float32 = 160 bytes; 48-byte minimum -> ceil(160/48) = 4,
  // capped at 3 shards of 4, 3, 3 rows. The small bias stays whole.
  MinSizePartitioner p({.min_shard_bytes = 48, .max_shards = 3});
  auto placed = place_variables({{"emb/embeddings", {10, 4}}, {"dense/bias", {2}}, {"dense/kernel", {8, 4}}}, 2, &p);
  ASSERT_EQ(placed.size(), 3u);
  const auto& emb = placed[0];
  ASSERT_TRUE(emb.sharded());
  ASSERT_EQ(emb.shards.size(), 3u);
  EXPECT_EQ(emb.shards[0].path, "emb/embeddings/part_0");
  EXPECT_EQ(emb.shards[2].path, "emb/embeddings/part_2");
  EXPECT_EQ(emb.shards[0].shape, (Shape{4, 4}));
  EXPECT_EQ(emb.shards[1].shape, (Shape{3, 4}));
  EXPECT_EQ(emb.shards[1].row_offset, 4);
  EXPECT_EQ(emb.shards[2].row_offset, 7);
  EXPECT_EQ(emb.shards[0].ps, 0);
  EXPECT_EQ(emb.shards[1].ps, 1);
  EXPECT_EQ(emb.shards[2].ps, 0);
  // The counter continues after the shards: the bias (8 bytes) is whole on ps 1.
  ASSERT_FALSE(placed[1].sharded());
  EXPECT_EQ(placed[1].shards[0].ps, 1);
  // 8x4 float32 = 128 bytes -> ceil(128/48) = 3 shards: 3, 3, 2 rows on ps 0, 1, 0.
  ASSERT_EQ(placed[2].shards.size(), 3u);
  EXPECT_EQ(placed[2].shards[2].shape, (Shape{2, 4}));
  EXPECT_EQ(placed[2].shards[0].ps, 0);
  EXPECT_EQ(placed[2].shards[1].ps, 1);
  // The same inputs place the same way (every task computes it alone).
  auto again = place_variables({{"emb/embeddings", {10, 4}}, {"dense/bias", {2}}, {"dense/kernel", {8, 4}}}, 2, &p);
  for (size_t i = 0; i < placed.size(); ++i)
    for (size_t s = 0; s < placed[i].shards.size(); ++s) EXPECT_EQ(again[i].shards[s].ps, placed[i].shards[s].ps);
}

TEST(Placement, BadInputsAreOneClearError) {
  expect_error<ValueError>([] { place_variables({{"a", {2}}}, 0); }, {"num_ps=0"});
  expect_error<ValueError>([] { place_variables({{"a", {2}}, {"a", {3}}}, 2); }, {"'a'", "share"});
  expect_error<ValueError>([] { place_variables({{"a", {-1, 2}}}, 2); }, {"'a'", "(None, 2)", "known"});
}

}  // namespace ps_foundation_test
}  // namespace kiln
