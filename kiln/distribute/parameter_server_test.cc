// Parameter-server foundations: roles from TF_CONFIG.
#include <gtest/gtest.h>

#include <map>

#include "kiln/core/error.h"
#include "kiln/distribute/cluster.h"

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

template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const ValueError& e) {
    return e.what();
  }
  return "";
}

void expect_has(const std::string& msg, std::initializer_list<const char*> parts) {
  EXPECT_FALSE(msg.empty()) << "no ValueError";
  for (auto* p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg << " lacks " << p;
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
    expect_has(error_of([&] { distribute::resolve_cluster(tf_config(kCluster + task)); }),
               {"TF_CONFIG", "'ps'", "parameter-server", "resolve_ps_cluster"});
  // Chief + workers stay data-parallel ranks, as before.
  auto c = distribute::resolve_cluster(
      tf_config(R"({"cluster": {"chief": ["a:1"], "worker": ["b:1"]}, "task": {"type": "worker", "index": 0}})"));
  EXPECT_EQ(c.rank, 1);
  EXPECT_EQ(c.world_size, 2);
}

TEST(PsCluster, BadTfConfigIsOneClearError) {
  auto err = [](const std::string& json) { return error_of([&] { resolve_ps_cluster(tf_config(json)); }); };
  expect_has(error_of([] { resolve_ps_cluster([](const std::string&) { return std::nullopt; }); }),
             {"TF_CONFIG", "\"ps\"", "docs/DISTRIBUTED.md"});
  expect_has(err("{oops"), {"TF_CONFIG", "JSON"});
  expect_has(err(R"({"cluster": {"worker": ["a:1"]}})"), {"TF_CONFIG", "\"task\""});
  expect_has(err(R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}})"),
             {"TF_CONFIG", "\"ps\"", "resolve_cluster"});
  expect_has(err(R"({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 0}})"), {"\"worker\""});
  expect_has(err(R"({"cluster": {"chief": ["a:1", "a:2"], "worker": ["a:3"], "ps": ["a:4"]},
                     "task": {"type": "ps", "index": 0}})"),
             {"cluster.chief", "at most one", "2"});
  expect_has(err(R"({"cluster": {"worker": ["a:1"], "ps": ["a:2"], "master": ["a:3"]},
                     "task": {"type": "ps", "index": 0}})"),
             {"'master'", "\"ps\""});
  expect_has(err(R"({"cluster": {"worker": ["a:1"], "ps": ["a"]}, "task": {"type": "ps", "index": 0}})"),
             {"cluster.ps[0]", "host:port"});
  expect_has(err(R"({"cluster": {"worker": ["a:1"], "ps": ["a:x"]}, "task": {"type": "ps", "index": 0}})"),
             {"cluster.ps[0] port", "'x'"});
  expect_has(err(R"({"cluster": {"worker": ["a:1"], "ps": ["a:2", "a:1"]}, "task": {"type": "ps", "index": 0}})"),
             {"cluster.ps[1]", "cluster.worker[0]", "a:1", "own port"});
  expect_has(err(R"({"cluster": {"worker": ["a:1"], "ps": ["a:2"]}, "task": {"type": "ps", "index": 1}})"),
             {"'ps'", "index 1", "not in the cluster", "lists 1"});
  expect_has(err(R"({"cluster": {"worker": ["a:1"], "ps": ["a:2"]}, "task": {"type": "ps", "index": -1}})"),
             {"index -1", "not in the cluster"});
  expect_has(err(R"({"cluster": {"worker": ["a:1"], "ps": ["a:2"]}, "task": {"type": "master", "index": 0}})"),
             {"'master'", "\"evaluator\""});
  expect_has(err(R"({"cluster": {"worker": ["a:1"], "ps": ["a:2"]}, "task": {"type": "ps"}})"),
             {"task must be", "\"index\""});
  expect_has(err(R"({"cluster": {"worker": "a:1", "ps": ["a:2"]}, "task": {"type": "ps", "index": 0}})"),
             {"cluster.worker", "list"});
}

}  // namespace ps_foundation_test
}  // namespace kiln
