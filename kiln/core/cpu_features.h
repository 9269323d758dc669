// CpuFeatures: the instruction sets of the CPU kiln runs on, and what they
// mean for precision and quantization.
//
// The machines kiln runs on differ: an Intel Xeon with AMX multiplies bf16
// and int8 tiles several times faster than float32; an AVX2-only CPU has no
// bf16 instructions at all (LibTorch's bf16 matmul then falls back to a
// generic loop, 40x slower than float32). Detect once, show it everywhere
// (`kiln show --system`, every benchmark's first lines) and warn once when a
// policy cannot run fast here.
//
//   const CpuFeatures& cpu = cpu_features();
//   if (!cpu.fast_bf16()) ...;          // bf16 runs as float32 on this CPU
//   std::cout << cpu.summary();         // "Intel(R) Xeon(R) ... | avx2 avx512f ... | oneDNN: avx512_core_bf16"
//
// Detection uses CPUID and XGETBV (the OS must enable the AVX-512 and AMX
// register state too) and asks oneDNN (Debian's libdnnl) which ISA it will
// dispatch to. Thread safety: cpu_features() is computed once, then
// read-only; warn_once() is thread-safe.
#pragma once

#include <string>
#include <vector>

namespace kiln {

struct CpuFeatures {
  std::string model_name;  // from /proc/cpuinfo; "unknown" elsewhere
  bool avx2 = false, fma = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_vnni = false, avx512_bf16 = false, avx512_fp16 = false;
  bool avx_vnni = false;
  bool amx_tile = false, amx_bf16 = false, amx_int8 = false;
  // The ISA oneDNN dispatches to ("avx512_core_amx", "avx2", ...), or "" when
  // kiln was built without oneDNN.
  std::string onednn_isa;

  // Native bf16 dot products (AVX512-BF16 or AMX-BF16).
  bool native_bf16() const { return avx512_bf16 || amx_bf16; }
  // bf16 matmuls faster than float32: native bf16, as oneDNN runs them.
  bool fast_bf16() const { return native_bf16(); }
  // Int8 dot-product instructions (AVX512-VNNI, AVX-VNNI or AMX-INT8).
  bool int8_dot() const { return avx512_vnni || avx_vnni || amx_int8; }
  // The class benchmarks report figures under: "amx", "avx512_bf16",
  // "avx512", "avx2" or "baseline".
  std::string isa_class() const;
  // The detected flags, space-separated ("avx2 fma avx512f ... amx_int8").
  std::string flags() const;
  // One line: model | flags | class | oneDNN ISA.
  std::string summary() const;
};

// Detected on first use.
const CpuFeatures& cpu_features();

// Prints "kiln: warning: <message>" to stderr the first time `key` is seen
// in this process; later calls with the same key print nothing. Returns
// whether it printed.
bool warn_once(const std::string& key, const std::string& message);

// The warning for running a dtype policy or a quantization mode on this CPU,
// or "" when it runs fast here: "mixed_bfloat16" on a CPU without native
// bf16, "float16"/"mixed_float16" on any CPU (LibTorch has no fast float16
// CPU kernels), "int8" without VNNI/AMX, "float8" (always emulated on CPU).
std::string precision_warning(const std::string& policy_or_mode);
// warn_once(precision_warning(...)) when it is not empty.
void warn_if_slow(const std::string& policy_or_mode);

}  // namespace kiln
