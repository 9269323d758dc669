#include <gtest/gtest.h>

#include <set>

#include "kiln/core/io.h"
#include "kiln/serving/batching/batching.h"
#include "kiln/serving/core/lifecycle.h"
#include "kiln/serving/core/model_config.h"
#include "kiln/serving/status.h"
#include "kiln/testing/expect_error.h"
#include "kiln/testing/testing.h"

namespace kiln::serving {
namespace {

using S = VersionState;

TEST(VersionLifecycle, LegalPathToDisabled) {
  VersionLifecycle l;
  EXPECT_EQ(l.state(), S::kNew);
  for (S s : {S::kLoading, S::kReady, S::kQuiescing, S::kUnloading, S::kDisabled}) {
    l.transition(s);
    EXPECT_EQ(l.state(), s);
  }
  EXPECT_TRUE(is_terminal(l.state()));
}

TEST(VersionLifecycle, EveryTransitionIsCheckedAgainstTheTable) {
  const std::vector<S> all = {S::kNew, S::kLoading, S::kReady, S::kQuiescing, S::kUnloading, S::kDisabled, S::kError};
  std::set<std::pair<S, S>> legal = {{S::kNew, S::kLoading},       {S::kNew, S::kDisabled},
                                     {S::kLoading, S::kReady},     {S::kLoading, S::kError},
                                     {S::kReady, S::kQuiescing},   {S::kQuiescing, S::kUnloading},
                                     {S::kUnloading, S::kDisabled}};
  for (S a : all)
    for (S b : all)
      EXPECT_EQ(is_legal_transition(a, b), legal.count({a, b}) > 0) << state_name(a) << "->" << state_name(b);
}

TEST(VersionLifecycle, IllegalTransitionsThrowNamingBothStates) {
  VersionLifecycle l;
  expect_error<StateError>([&] { l.transition(S::kReady); }, {"New -> Ready"});
  l.transition(S::kLoading);
  expect_error<StateError>([&] { l.transition(S::kQuiescing); }, {"Loading -> Quiescing"});
  l.fail("bad weights");
  EXPECT_EQ(l.state(), S::kError);
  EXPECT_EQ(l.error(), "bad weights");
  expect_error<StateError>([&] { l.transition(S::kLoading); }, {"Error -> Loading"});
  EXPECT_STREQ(tfs_state_name(S::kError), "END");
  EXPECT_STREQ(tfs_state_name(S::kReady), "AVAILABLE");
  EXPECT_STREQ(tfs_state_name(S::kQuiescing), "UNLOADING");
}

TEST(Status, GrpcCodesMapToTfServingHttpCodes) {
  EXPECT_EQ(http_status(Code::kOk), 200);
  EXPECT_EQ(http_status(Code::kInvalidArgument), 400);
  EXPECT_EQ(http_status(Code::kFailedPrecondition), 400);
  EXPECT_EQ(http_status(Code::kNotFound), 404);
  EXPECT_EQ(http_status(Code::kResourceExhausted), 429);
  EXPECT_EQ(http_status(Code::kDeadlineExceeded), 504);
  EXPECT_EQ(http_status(Code::kUnavailable), 503);
  EXPECT_EQ(http_status(Code::kUnimplemented), 501);
  EXPECT_EQ(http_status(Code::kInternal), 500);
  EXPECT_EQ(http_status(Code::kUnauthenticated), 401);
  EXPECT_STREQ(code_name(Code::kResourceExhausted), "RESOURCE_EXHAUSTED");
  EXPECT_EQ(status_of(NotFoundError("x")).code, Code::kNotFound);
  EXPECT_EQ(status_of(ValueError("x")).code, Code::kInvalidArgument);
  EXPECT_EQ(status_of(StateError("x")).code, Code::kFailedPrecondition);
  EXPECT_EQ(status_of(ServingError(Code::kAborted, "x")).code, Code::kAborted);
  EXPECT_EQ(status_of(std::runtime_error("x")).code, Code::kInternal);
  // Memory the device cannot give: RESOURCE_EXHAUSTED (HTTP 429), the
  // request alone fails. A real allocator failure (beyond any address space).
  EXPECT_EQ(status_of(ResourceExhaustedError("x")).code, Code::kResourceExhausted);
  try {
    at::empty({int64_t{1} << 62}, at::kByte);
    ADD_FAILURE() << "a 4 EiB allocation succeeded";
  } catch (const c10::Error& e) {
    const Status s = status_of(e);
    EXPECT_EQ(s.code, Code::kResourceExhausted) << s.message;
    EXPECT_NE(s.message.find("out of memory"), std::string::npos) << s.message;
  }
}

TEST(ModelConfig, ParsesTfServingTextFormat) {
  auto c = parse_model_config(R"(
    # two models
    model_config_list {
      config {
        name: "mnist"
        base_path: "/models/mnist"
        model_platform: "kiln"
        model_version_policy { latest { num_versions: 2 } }
        version_labels { key: "stable" value: 1 }
        version_labels { key: 'canary' value: 2 }
      }
      config: {
        name: 'b' base_path: "/p/b";
        model_version_policy { specific { versions: 1 versions: 3 } }
      }
      config { name: "c" base_path: "/p/c" model_version_policy { all {} } }
    })");
  ASSERT_EQ(c.models.size(), 3u);
  EXPECT_EQ(c.models[0].name, "mnist");
  EXPECT_EQ(c.models[0].base_path, "/models/mnist");
  EXPECT_EQ(c.models[0].version_policy.kind, VersionPolicy::Kind::kLatest);
  EXPECT_EQ(c.models[0].version_policy.num_versions, 2);
  EXPECT_EQ(c.models[0].version_labels.at("stable"), 1);
  EXPECT_EQ(c.models[0].version_labels.at("canary"), 2);
  EXPECT_EQ(c.models[1].version_policy.kind, VersionPolicy::Kind::kSpecific);
  EXPECT_EQ(c.models[1].version_policy.versions, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(c.models[2].version_policy.kind, VersionPolicy::Kind::kAll);
  EXPECT_EQ(c.models[0].version_policy.select({5, 1, 3}), (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(c.models[1].version_policy.select({1, 2, 3}), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(c.models[2].version_policy.select({2, 1}), (std::vector<int64_t>{1, 2}));
  // The JSON form round-trips.
  auto j = parse_model_config(c.to_json().dump());
  ASSERT_EQ(j.models.size(), 3u);
  EXPECT_EQ(j.models[0].version_labels.at("canary"), 2);
  EXPECT_EQ(j.models[1].version_policy.versions, (std::vector<int64_t>{1, 3}));
}

TEST(ModelConfig, ErrorsNameTheLineAndTheFix) {
  expect_error<ValueError>(
      [] { parse_model_config("model_config_list { config { name: \"a\" base_path: \"/p\" bogus: 1 } }"); },
      {"line 1", "unknown field `bogus`"});
  expect_error<ValueError>(
      [] { parse_model_config("model_config_list {\n config { name: \"a\"\n base_path: \"/p\" }"); }, {"missing '}'"});
  expect_error<ValueError>(
      [] { parse_model_config("model_config_list { config { name: \"../x\" base_path: \"/p\" } }"); },
      {"invalid model name", "../x"});
  expect_error<ValueError>(
      [] {
        parse_model_config(
            "model_config_list { config { name: \"a\" base_path: \"/p\" } config { name: \"a\" base_path: \"/q\" } }");
      },
      {"listed twice"});
  expect_error<ValueError>(
      [] {
        parse_model_config(
            "model_config_list { config { name: \"a\" base_path: \"/p\" model_version_policy { newest {} } } }");
      },
      {"unknown version policy `newest`"});
}

TEST(ModelConfig, TextFormatThroughLibprotobuf) {
  // latest {} serves one version (TF Serving's default); a written 0 is refused.
  auto c = parse_model_config(
      "model_config_list { config { name: 'a' base_path: '/p' model_type: TENSORFLOW\n"
      "  model_version_policy { latest {} } } }");
  EXPECT_EQ(c.models.at(0).version_policy.num_versions, 1);
  EXPECT_EQ(c.models.at(0).model_platform, "kiln");
  expect_error<ValueError>(
      [] {
        parse_model_config(
            "model_config_list { config { name: 'a' base_path: '/p' "
            "model_version_policy { latest { num_versions: 0 } } } }");
      },
      {"num_versions", ">= 1", "Received: 0"});
  expect_error<ValueError>(
      [] { parse_model_config("model_config_list { config { name: 'a' base_path: '/p' model_version_policy {} } }"); },
      {"line 1, column 56", "exactly one of latest"});
  expect_error<ValueError>(
      [] {
        parse_model_config(
            "model_config_list { config { name: 'a' base_path: '/p' "
            "model_version_policy { latest {} all {} } } }");
      },
      {"line 1", "oneof"});
  // One error naming the file, the line, the column and the fields there are.
  TempDir dir;
  atomic_write_file(dir.path() + "/models.config", "model_config_list {\n  config {\n    nme: \"a\"\n  }\n}\n");
  expect_error<ValueError>([&] { read_model_config_file(dir.path() + "/models.config"); },
                           {dir.path() + "/models.config: line 3, column 5: unknown field `nme` in ModelConfig",
                            "expected one of: name, base_path"});
  expect_error<ValueError>([] { parse_model_config("model_config_list { config { name: 7 } }"); },
                           {"line 1, column 36", "expected string"});
}

TEST(Batching, ParsesTfServingBatchingParameters) {
  auto o = parse_batching_parameters(R"(
    max_batch_size { value: 128 }
    batch_timeout_micros { value: 500 }
    num_batch_threads { value: 4 }
    max_enqueued_batches { value: 100 }
    allowed_batch_sizes: 32
    allowed_batch_sizes: 128
  )");
  EXPECT_EQ(o.max_batch_size, 128);
  EXPECT_EQ(o.batch_timeout_micros, 500);
  EXPECT_EQ(o.num_batch_threads, 4);
  EXPECT_EQ(o.max_enqueued_batches, 100);
  EXPECT_EQ(o.allowed_batch_sizes, (std::vector<int64_t>{32, 128}));
  expect_error<ValueError>([] { parse_batching_parameters("max_batch_size { value: 0 }"); }, {"max_batch_size=0"});
  expect_error<ValueError>([] { parse_batching_parameters("max_batch_size { value: 8 } allowed_batch_sizes: 4"); },
                           {"must equal max_batch_size"});
  expect_error<ValueError>([] { parse_batching_parameters("max_batch_size: 8"); }, {"max_batch_size { value: ... }"});
  // TF Serving's other fields are accepted; an unknown one names the file and line.
  o = parse_batching_parameters(
      "max_batch_size { value: 64 } thread_pool_name { value: 'b' }\n"
      "enable_large_batch_splitting { value: true } max_execution_batch_size { value: 16 }");
  EXPECT_EQ(o.max_batch_size, 64);
  expect_error<ValueError>(
      [] {
        parse_batching_parameters("max_batch_size { value: 8 }\nmax_batch { value: 8 }",
                                  "--batching_parameters_file b.config");
      },
      {"--batching_parameters_file b.config: line 2, column 1: unknown field `max_batch`"});
}

TEST(Batching, UnsetParametersTakeTheDevicesDefaultsAndSetOnesWin) {
  // What a parameters file leaves out stays unset until the version's device is known.
  BatchingOptions unset = parse_batching_parameters("num_batch_threads { value: 4 }");
  EXPECT_FALSE(unset.max_batch_size.has_value());
  EXPECT_FALSE(unset.batch_timeout_micros.has_value());
  EXPECT_TRUE(unset.to_json()["max_batch_size"].is_null());

  BatchingOptions cpu = batching_for_device(unset, at::Device(at::kCPU));
  EXPECT_EQ(cpu.max_batch_size, kCpuMaxBatchSize);
  EXPECT_EQ(cpu.batch_timeout_micros, kCpuBatchTimeoutMicros);
  EXPECT_FALSE(cpu.pin_batches) << "page-locked memory only helps a copy to a GPU";
  EXPECT_EQ(cpu.num_batch_threads, 4);
  // The CPU's defaults are what they were before GPUs had their own.
  EXPECT_EQ(kCpuMaxBatchSize, 32);
  EXPECT_EQ(kCpuBatchTimeoutMicros, 1000);

  // Pure: a GPU this machine may lack is fine.
  BatchingOptions gpu = batching_for_device(unset, at::Device(at::kCUDA, 1));
  EXPECT_EQ(gpu.max_batch_size, kGpuMaxBatchSize);
  EXPECT_EQ(gpu.batch_timeout_micros, kGpuBatchTimeoutMicros);
  EXPECT_TRUE(gpu.pin_batches);
  EXPECT_EQ(gpu.num_batch_threads, 4);
  EXPECT_GT(kGpuMaxBatchSize, kCpuMaxBatchSize);
  gpu.validate();

  // A value that was set wins on every device, 0 included (TF Serving's "do not wait").
  BatchingOptions set = parse_batching_parameters("max_batch_size { value: 8 } batch_timeout_micros { value: 0 }");
  for (const at::Device& d : {at::Device(at::kCPU), at::Device(at::kCUDA, 0)}) {
    BatchingOptions r = batching_for_device(set, d);
    EXPECT_EQ(r.max_batch_size, 8) << d;
    EXPECT_EQ(r.batch_timeout_micros, 0) << d;
  }
  // Only one of them set: the other still follows the device.
  BatchingOptions half;
  half.batch_timeout_micros = 300;
  EXPECT_EQ(batching_for_device(half, at::Device(at::kCUDA, 0)).max_batch_size, kGpuMaxBatchSize);
  EXPECT_EQ(batching_for_device(half, at::Device(at::kCUDA, 0)).batch_timeout_micros, 300);

  // allowed_batch_sizes without max_batch_size: the last allowed size is the
  // maximum (TF Serving requires them equal), on a GPU too.
  BatchingOptions allowed = parse_batching_parameters("allowed_batch_sizes: 8 allowed_batch_sizes: 16");
  EXPECT_EQ(batching_for_device(allowed, at::Device(at::kCUDA, 0)).max_batch_size, 16);
  EXPECT_EQ(batching_for_device(allowed, at::Device(at::kCPU)).max_batch_size, 16);
  batching_for_device(allowed, at::Device(at::kCUDA, 0)).validate();
}

}  // namespace
}  // namespace kiln::serving
