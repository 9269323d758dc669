#include "kiln/core/device.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <torch/cuda.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "kiln/core/error.h"

namespace kiln {
namespace {

std::mutex g_mu;
std::optional<at::Device> g_override;  // guarded by g_mu
thread_local std::vector<at::Device> t_device_scopes;
std::atomic<int> g_tf32{-1};  // -1: not decided yet (read $KILN_TF32 on first use)
std::once_flag g_tf32_applied;

// LOCAL_RANK as set by kiln launch or torchrun; -1 when absent or malformed.
int local_rank() {
  const char* v = std::getenv("LOCAL_RANK");
  if (!v || !*v) return -1;
  char* end = nullptr;
  const long r = std::strtol(v, &end, 10);
  return (*end == '\0' && r >= 0 && r < 1 << 16) ? static_cast<int>(r) : -1;
}

// "cuda" without an index: the launcher's local rank (one process per GPU),
// else the first GPU.
int unindexed_gpu() {
  const int r = local_rank();
  return r < 0 ? 0 : r;
}

const char* const kAccepted = "cpu, cuda, cuda:N (also gpu, gpu:N, /GPU:N)";

std::string plural_gpus(int n) { return std::to_string(n) + (n == 1 ? " GPU" : " GPUs"); }

}  // namespace

at::Device parse_device(const std::string& text, const std::string& source) {
  std::string s;
  for (char c : text)
    if (!std::isspace(static_cast<unsigned char>(c)))
      s += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (!s.empty() && s[0] == '/') s.erase(0, 1);   // TensorFlow's "/GPU:0"
  if (s.rfind("device:", 0) == 0) s.erase(0, 7);  // "/device:GPU:0"
  auto bad = [&](const std::string& why) {
    return ValueError(source + ": '" + text + "' is not a device" + why + "; use one of " + kAccepted);
  };
  if (s == "cpu" || s == "cpu:0") return at::Device(at::kCPU);
  std::string kind = s, index;
  const auto colon = s.find(':');
  if (colon != std::string::npos) {
    kind = s.substr(0, colon);
    index = s.substr(colon + 1);
  }
  if (kind != "cuda" && kind != "gpu") throw bad("");
  if (colon == std::string::npos) return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(unindexed_gpu()));
  if (index.empty() || index.size() > 4 || !std::all_of(index.begin(), index.end(), ::isdigit))
    throw bad(" (the index after ':' must be a GPU number, 0 for the first)");
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(std::stoi(index)));
}

int gpu_count() {
  if (!at::hasCUDA()) return 0;
  try {
    return static_cast<int>(torch::cuda::device_count());
  } catch (...) {
    return 0;
  }
}

std::string available_devices() {
  std::string s = "cpu";
  for (int i = 0, n = gpu_count(); i < n; ++i) s += ", cuda:" + std::to_string(i);
  return s;
}

at::Device check_device(const at::Device& device, const std::string& source) {
  if (device.is_cpu()) return device;
  if (!device.is_cuda())
    throw ValueError(source + ": kiln computes on the CPU or on CUDA GPUs, not on " + device.str() + "; use one of " +
                     kAccepted);
  const int n = gpu_count();
  if (n == 0) {
    // CUDA's device guard is registered when LibTorch's CUDA library is
    // loaded, GPU or not (at::hasCUDA() also needs a GPU).
    const std::string why = c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)
                                ? "no GPU is visible to this process (no NVIDIA driver or GPU, or "
                                  "CUDA_VISIBLE_DEVICES hides them)"
                                : "this LibTorch is a CPU-only build";
    throw ValueError(source + " " + device.str() + ": " + why + "; this machine computes on: cpu; use --device cpu");
  }
  const int index = device.has_index() ? device.index() : 0;
  if (index >= n)
    throw ValueError(source + " " + device.str() + ": this machine has " + plural_gpus(n) + " (" + available_devices() +
                     "); use --device cuda:" + std::to_string(n - 1) + " or lower, or cpu");
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
}

at::Device resolve_device(const std::string& text, const std::string& source) {
  return check_device(parse_device(text, source), source);
}

at::Device default_device() {
  if (!t_device_scopes.empty()) return t_device_scopes.back();
  {
    std::lock_guard<std::mutex> l(g_mu);
    if (g_override) return *g_override;
  }
  at::Device d(at::kCPU);
  const char* env = std::getenv("KILN_DEVICE");
  if (env && *env) {
    d = resolve_device(env, "KILN_DEVICE");
  } else if (const int n = gpu_count(); n > 0) {
    d = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(unindexed_gpu() % n));
  }
  if (d.is_cuda()) std::call_once(g_tf32_applied, apply_tf32_setting);
  return d;
}

void set_default_device(std::optional<at::Device> device) {
  if (device) *device = check_device(*device, "device");
  if (device && device->is_cuda()) std::call_once(g_tf32_applied, apply_tf32_setting);
  std::lock_guard<std::mutex> l(g_mu);
  g_override = device;
}

DeviceScope::DeviceScope(const at::Device& device) {
  t_device_scopes.push_back(check_device(device, "DeviceScope"));
  if (t_device_scopes.back().is_cuda()) std::call_once(g_tf32_applied, apply_tf32_setting);
}
DeviceScope::DeviceScope(const std::string& text) : DeviceScope(parse_device(text, "DeviceScope")) {}
DeviceScope::~DeviceScope() { t_device_scopes.pop_back(); }

bool is_out_of_memory(const std::exception& e) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e)) return true;
  const auto* c = dynamic_cast<const c10::Error*>(&e);
  const std::string m = c ? c->what_without_backtrace() : e.what();
  return m.find("can't allocate memory") != std::string::npos || m.find("out of memory") != std::string::npos;
}

bool tf32_enabled() {
  int v = g_tf32.load();
  if (v < 0) {
    const char* env = std::getenv("KILN_TF32");
    v = (env && std::string(env) == "0") ? 0 : 1;
    int expected = -1;
    if (!g_tf32.compare_exchange_strong(expected, v)) v = expected;
  }
  return v == 1;
}

void set_tf32_enabled(bool enabled) {
  g_tf32.store(enabled ? 1 : 0);
  apply_tf32_setting();
}

void apply_tf32_setting() {
  const auto p = tf32_enabled() ? at::Float32Precision::TF32 : at::Float32Precision::IEEE;
  auto& ctx = at::globalContext();
  ctx.setFloat32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL, p);
  ctx.setFloat32Precision(at::Float32Backend::CUDA, at::Float32Op::CONV, p);
}

}  // namespace kiln
