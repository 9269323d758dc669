// Devices: where kiln computes, with Keras's and TensorFlow's defaults.
//
// The device a new variable, optimizer slot, metric accumulator or input
// batch goes to is default_device():
//   1. the innermost DeviceScope on this thread (TensorFlow's
//      `with tf.device("/GPU:1"):`), else
//   2. the process-wide override (set_default_device: the CLI's --device
//      flag, a spec's "device"), else
//   3. $KILN_DEVICE ("cpu", "cuda", "cuda:N"), else
//   4. the first GPU when one is visible (Keras's default), else the CPU.
// "cuda" without an index under a launcher that sets LOCAL_RANK (kiln
// launch, torchrun) means cuda:LOCAL_RANK, so one process per GPU needs no
// per-rank flag; the same holds for rule 4.
//
//   kiln::DeviceScope on_gpu("cuda:1");   // or kiln::DeviceScope(at::Device(at::kCUDA, 1))
//   auto model = build_model();           // its variables live on cuda:1
//
// Model directories are device-agnostic: weights are written from host
// copies and loaded into variables wherever they live.
//
// Thread safety: every function may be called from any thread; a
// DeviceScope affects only the thread that made it.
#pragma once

#include <ATen/ATen.h>

#include <exception>
#include <optional>
#include <string>

namespace kiln {

// Parses "cpu", "cuda", "cuda:N", "gpu", "gpu:N" (Keras/TensorFlow's
// "/GPU:N" and "GPU:N" too; case-insensitive). ValueError names the text
// and the accepted forms; `source` ("--device", "KILN_DEVICE", ...) prefixes
// the message. "cuda" without an index parses to cuda:LOCAL_RANK under a
// launcher, else cuda:0.
at::Device parse_device(const std::string& text, const std::string& source = "device");

// The number of GPUs this process can use: 0 on a machine without a GPU or
// driver, or with a LibTorch built without CUDA. Never throws.
int gpu_count();

// What this process can compute on, for messages: "cpu" or "cpu, cuda:0,
// cuda:1".
std::string available_devices();

// Throws ValueError when `device` is not on this machine, naming what is
// ("--device cuda:1: this machine has 1 GPU (cuda:0); use --device cuda:0 or
// cpu"; "--device cuda: no GPU is visible to this process (no NVIDIA
// driver); use --device cpu"). Returns `device` otherwise.
at::Device check_device(const at::Device& device, const std::string& source = "device");

// parse_device then check_device.
at::Device resolve_device(const std::string& text, const std::string& source = "device");

// The device new state goes to (the rules at the top of this file). Throws
// ValueError when $KILN_DEVICE is malformed or names a missing GPU.
at::Device default_device();

// The process-wide override (rule 2); nullopt clears it.
void set_default_device(std::optional<at::Device> device);

// Scoped default device for this thread; nests.
class DeviceScope {
 public:
  explicit DeviceScope(const at::Device& device);
  // Parses and checks `text` as resolve_device does.
  explicit DeviceScope(const std::string& text);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
};

// Whether `e` is an allocation the device could not give: LibTorch's
// OutOfMemoryError (a GPU's caching allocator) or its CPU allocator's
// "can't allocate memory".
bool is_out_of_memory(const std::exception& e);

// TF32 on float32 matrix products and convolutions on GPUs of compute
// capability 8.0 and above. TensorFlow's default is on
// (tf.config.experimental.enable_tensor_float_32_execution); so is kiln's,
// unless $KILN_TF32 is "0". It keeps float32's range with a 10-bit mantissa
// in the products' inputs (about 1e-3 relative error per product); turn it
// off where float32's precision matters more than speed. No effect on CPUs.
void set_tf32_enabled(bool enabled);
bool tf32_enabled();
// Applies the TF32 setting to LibTorch (called by default_device() the
// first time it picks a GPU, and by set_tf32_enabled).
void apply_tf32_setting();

}  // namespace kiln
