// ParameterServerStrategy from the spec's "distribution" object and
// TF_CONFIG: every key, each task's process index, and one clear error per
// bad entry. (The jobs themselves run in ps_training_test.cc.)
#include "kiln/ps/ps_strategy.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "kiln/core/error.h"
#include "kiln/testing/expect_error.h"

namespace kiln {
namespace {

// TF_CONFIG for the scope of a test, then as it was.
class ScopedTfConfig {
 public:
  explicit ScopedTfConfig(const std::string& value) {
    if (const char* v = std::getenv("TF_CONFIG")) old_ = v;
    setenv("TF_CONFIG", value.c_str(), 1);
  }
  ~ScopedTfConfig() {
    if (old_)
      setenv("TF_CONFIG", old_->c_str(), 1);
    else
      unsetenv("TF_CONFIG");
  }

 private:
  std::optional<std::string> old_;
};

std::string tf_config(const std::string& type, int index, bool with_chief = true) {
  return std::string(R"({"cluster": {)") + (with_chief ? R"("chief": ["127.0.0.1:2000"], )" : "") +
         R"("worker": ["127.0.0.1:2001", "127.0.0.1:2002", "127.0.0.1:2003"], )"
         R"("ps": ["127.0.0.1:2004", "127.0.0.1:2005"]}, "task": {"type": ")" +
         type + R"(", "index": )" + std::to_string(index) + "}}";
}

TEST(ParameterServerStrategy, SpecConfigReadsEveryKeyAndTheCluster) {
  ScopedTfConfig env(tf_config("worker", 1));
  auto s = ps::parameter_server_from_config(Json::parse(R"({"type": "parameter_server", "mode": "sync",
      "backup_workers": 1, "partitioner": {"type": "min_size", "min_shard_bytes": 1024, "max_shards": 2},
      "worker_timeout_seconds": 3, "ps_timeout_seconds": 9, "checkpoint_steps": 50})"));
  EXPECT_EQ(s->options().mode, "sync");
  EXPECT_EQ(s->options().backup_workers, 1);
  EXPECT_EQ(s->options().partitioner["max_shards"], 2);
  EXPECT_EQ(s->options().worker_timeout_seconds, 3);
  EXPECT_EQ(s->options().ps_timeout_seconds, 9);
  EXPECT_EQ(s->options().checkpoint_steps, 50);
  EXPECT_TRUE(s->cluster().is_worker());
  EXPECT_EQ(s->cluster().num_ps(), 2);
  // chief 0, workers 1..3, ps tasks after: only the chief prints and writes.
  EXPECT_EQ(s->process_index(), 2);
  EXPECT_EQ(s->num_replicas(), 1);
  {
    ScopedTfConfig chief(tf_config("chief", 0));
    EXPECT_EQ(ps::parameter_server_from_config(Json{{"type", "parameter_server"}})->process_index(), 0);
  }
  {
    ScopedTfConfig ps1(tf_config("ps", 1));
    auto p = ps::parameter_server_from_config(Json{{"type", "parameter_server"}});
    EXPECT_EQ(p->process_index(), 5);
    EXPECT_EQ(p->options().mode, "async");  // the defaults
    EXPECT_EQ(p->options().worker_timeout_seconds, 10);
  }
}

TEST(ParameterServerStrategy, BadConfigsNameTheProblemAndTheFix) {
  ScopedTfConfig env(tf_config("worker", 0));
  auto from = [](const char* text) { return ps::parameter_server_from_config(Json::parse(text)); };
  expect_error<ValueError>([&] { from(R"({"type": "parameter_server", "modes": "sync"})"); }, {"modes"});
  expect_error<ValueError>([&] { from(R"({"type": "parameter_server", "mode": "semi"})"); },
                           {"\"async\" or \"sync\"", "semi"});
  expect_error<ValueError>([&] { from(R"({"type": "parameter_server", "backup_workers": 1})"); },
                           {"backup_workers", "\"mode\": \"sync\""});
  expect_error<ValueError>([&] { from(R"({"type": "parameter_server", "mode": "sync", "backup_workers": 3})"); },
                           {"backup_workers=3", "3 workers", "fewer backup workers"});
  expect_error<ValueError>([&] { from(R"({"type": "parameter_server", "partitioner": {"type": "even"}})"); },
                           {"\"min_size\", \"max_size\" or \"fixed\"", "even"});
  expect_error<ValueError>(
      [&] { from(R"({"type": "parameter_server", "partitioner": {"type": "fixed", "shards": 2}})"); }, {"shards"});
  expect_error<ValueError>([&] { from(R"({"type": "parameter_server", "worker_timeout_seconds": 0})"); },
                           {"worker_timeout_seconds"});
  ScopedTfConfig no_chief(tf_config("worker", 0, /*with_chief=*/false));
  expect_error<ValueError>([&] { from(R"({"type": "parameter_server"})"); }, {"no \"chief\"", "add one"});
}

}  // namespace
}  // namespace kiln
