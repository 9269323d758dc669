// Devices as a CPU-only machine sees them: parsing, the errors when a GPU
// is asked for and missing, the default device's rules, scopes, and where
// variables go. The GPU side is in kiln/training/device_cuda_test.cc.
#include "kiln/core/device.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "kiln/core/error.h"
#include "kiln/core/variable.h"
#include "kiln/testing/expect_error.h"

namespace kiln {
namespace {

// Sets (or unsets, for nullopt) an environment variable for one scope.
class EnvScope {
 public:
  EnvScope(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value->c_str(), 1);
    else
      ::unsetenv(name);
  }
  ~EnvScope() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(Device, ParsesKerasTensorFlowAndPyTorchSpellings) {
  EnvScope no_rank("LOCAL_RANK", std::nullopt);
  EXPECT_EQ(parse_device("cpu"), at::Device(at::kCPU));
  EXPECT_EQ(parse_device(" CPU "), at::Device(at::kCPU));
  EXPECT_EQ(parse_device("cuda"), at::Device(at::kCUDA, 0));
  EXPECT_EQ(parse_device("cuda:3"), at::Device(at::kCUDA, 3));
  EXPECT_EQ(parse_device("gpu:1"), at::Device(at::kCUDA, 1));
  EXPECT_EQ(parse_device("/GPU:2"), at::Device(at::kCUDA, 2));
  EXPECT_EQ(parse_device("/device:GPU:0"), at::Device(at::kCUDA, 0));
}

TEST(Device, UnindexedGpuIsTheLaunchersLocalRank) {
  EnvScope rank("LOCAL_RANK", "2");
  EXPECT_EQ(parse_device("cuda"), at::Device(at::kCUDA, 2));
  EXPECT_EQ(parse_device("cuda:0"), at::Device(at::kCUDA, 0));  // an explicit index wins
}

TEST(Device, MalformedDevicesNameTheTextAndTheAcceptedForms) {
  for (const char* bad : {"tpu", "cuda:", "cuda:x", "cuda:-1", "gpu0", ""})
    expect_error<ValueError>([&] { parse_device(bad, "--device"); },
                             {"--device: '" + std::string(bad) + "'", "cuda:N"});
}

TEST(Device, AMissingGpuIsOneErrorNamingWhatThereIs) {
  const int n = gpu_count();
  const std::string asked = "cuda:" + std::to_string(n);  // one past the last GPU (cuda:0 without a GPU)
  auto resolve = [&] { resolve_device(asked, "--device"); };
  if (n == 0) {
    expect_error<ValueError>(resolve,
                             {"--device " + asked, "no GPU is visible", "computes on: cpu", "; use --device cpu"});
    EXPECT_EQ(available_devices(), "cpu");
  } else {
    expect_error<ValueError>(resolve, {"--device " + asked, "this machine has " + std::to_string(n), "or cpu"});
  }
  EXPECT_EQ(check_device(at::Device(at::kCPU)), at::Device(at::kCPU));
}

TEST(Device, DefaultIsTheFirstGpuWhenThereIsOneElseTheCpu) {
  EnvScope no_env("KILN_DEVICE", std::nullopt);
  EnvScope no_rank("LOCAL_RANK", std::nullopt);
  EXPECT_EQ(default_device(), gpu_count() > 0 ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU));
}

TEST(Device, EnvironmentOverrideAndScopesNestInTensorFlowsOrder) {
  EnvScope env("KILN_DEVICE", "cpu");
  EXPECT_EQ(default_device(), at::Device(at::kCPU));
  {
    EnvScope bad("KILN_DEVICE", "tpu:0");
    expect_error<ValueError>([] { default_device(); }, {"KILN_DEVICE: 'tpu:0'"});
    // A scope or the process-wide override wins over the variable.
    DeviceScope cpu("cpu");
    EXPECT_EQ(default_device(), at::Device(at::kCPU));
  }
  set_default_device(at::Device(at::kCPU));
  EXPECT_EQ(default_device(), at::Device(at::kCPU));
  set_default_device(std::nullopt);
  if (gpu_count() == 0) {
    EXPECT_THROW(DeviceScope("cuda"), ValueError);
    EXPECT_THROW(set_default_device(at::Device(at::kCUDA, 0)), ValueError);
    EXPECT_EQ(default_device(), at::Device(at::kCPU));  // nothing was left set by the failures
  }
}

TEST(Device, VariablesAreCreatedOnTheDefaultDevice) {
  DeviceScope cpu("cpu");
  VariableSpec spec;
  spec.name = "kernel";
  spec.shape = {3, 2};
  spec.initializer = Initializer::from_json("ones");
  VariablePtr v = VariableFactory::create(spec, DTypePolicy("float32"));
  EXPECT_TRUE(v->value().device().is_cpu());
  EXPECT_TRUE(at::equal(v->value(), at::ones({3, 2})));
}

TEST(Device, Tf32FollowsTensorFlowsDefaultAndCanBeTurnedOff) {
  const bool before = tf32_enabled();
  set_tf32_enabled(false);
  EXPECT_FALSE(tf32_enabled());
  EXPECT_EQ(at::globalContext().float32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL),
            at::Float32Precision::IEEE);
  EXPECT_EQ(at::globalContext().float32Precision(at::Float32Backend::CUDA, at::Float32Op::CONV),
            at::Float32Precision::IEEE);
  set_tf32_enabled(true);
  EXPECT_TRUE(tf32_enabled());
  EXPECT_EQ(at::globalContext().float32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL),
            at::Float32Precision::TF32);
  set_tf32_enabled(before);
}

}  // namespace
}  // namespace kiln
