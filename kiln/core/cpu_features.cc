#include "kiln/core/cpu_features.h"

#include <cpuid.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <mutex>
#include <set>

#ifdef KILN_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif

namespace kiln {
namespace {

bool bit(unsigned v, int b) { return (v >> b) & 1u; }

uint64_t xgetbv0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

std::string read_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      auto pos = line.find(':');
      if (pos != std::string::npos) return line.substr(line.find_first_not_of(" \t", pos + 1));
    }
  return "unknown";
}

#ifdef KILN_HAVE_DNNL
std::string onednn_isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_sse41:
      return "sse41";
    case dnnl_cpu_isa_avx:
      return "avx";
    case dnnl_cpu_isa_avx2:
      return "avx2";
    case dnnl_cpu_isa_avx2_vnni:
      return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core:
      return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "isa " + std::to_string(static_cast<int>(isa));
  }
}
#endif

CpuFeatures detect() {
  CpuFeatures f;
  f.model_name = read_model_name();
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = bit(c, 27), fma = bit(c, 12), avx = bit(c, 28);
  const uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  const bool ymm = (xcr0 & 0x6) == 0x6;            // SSE + AVX state
  const bool zmm = ymm && (xcr0 & 0xe0) == 0xe0;   // opmask + ZMM state
  const bool tiles = (xcr0 & 0x60000) == 0x60000;  // XTILECFG + XTILEDATA
  f.fma = fma && ymm;
  unsigned max_leaf = __get_cpuid_max(0, nullptr);
  if (max_leaf >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    f.avx2 = avx && ymm && bit(b, 5);
    f.avx512f = zmm && bit(b, 16);
    f.avx512dq = zmm && bit(b, 17);
    f.avx512bw = zmm && bit(b, 30);
    f.avx512vl = zmm && bit(b, 31);
    f.avx512_vnni = zmm && bit(c, 11);
    f.avx512_fp16 = zmm && bit(d, 23);
    f.amx_bf16 = tiles && bit(d, 22);
    f.amx_tile = tiles && bit(d, 24);
    f.amx_int8 = tiles && bit(d, 25);
    unsigned eax1 = 0;
    __cpuid_count(7, 1, eax1, b, c, d);
    f.avx_vnni = ymm && bit(eax1, 4);
    f.avx512_bf16 = zmm && bit(eax1, 5);
  }
#ifdef KILN_HAVE_DNNL
  f.onednn_isa = onednn_isa_name(dnnl_get_effective_cpu_isa());
#endif
  return f;
}

std::mutex g_warn_mu;
std::set<std::string>& warned() {  // guarded by g_warn_mu
  static std::set<std::string> s;
  return s;
}

}  // namespace

std::string CpuFeatures::isa_class() const {
  if (amx_bf16 || amx_int8) return "amx";
  if (avx512_bf16) return "avx512_bf16";
  if (avx512f && avx512bw) return "avx512";
  if (avx2) return "avx2";
  return "baseline";
}

std::string CpuFeatures::flags() const {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (on) s += (s.empty() ? "" : " ") + std::string(name);
  };
  add(avx2, "avx2");
  add(fma, "fma");
  add(avx512f, "avx512f");
  add(avx512dq, "avx512dq");
  add(avx512bw, "avx512bw");
  add(avx512vl, "avx512vl");
  add(avx512_vnni, "avx512_vnni");
  add(avx512_bf16, "avx512_bf16");
  add(avx512_fp16, "avx512_fp16");
  add(avx_vnni, "avx_vnni");
  add(amx_tile, "amx_tile");
  add(amx_bf16, "amx_bf16");
  add(amx_int8, "amx_int8");
  return s.empty() ? "none of avx2/avx512/amx" : s;
}

std::string CpuFeatures::summary() const {
  return model_name + " | " + flags() + " | class " + isa_class() + " | oneDNN " +
         (onednn_isa.empty() ? "not linked" : onednn_isa);
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

bool warn_once(const std::string& key, const std::string& message) {
  {
    std::lock_guard<std::mutex> l(g_warn_mu);
    if (!warned().insert(key).second) return false;
  }
  std::cerr << "kiln: warning: " << message << std::endl;
  return true;
}

std::string precision_warning(const std::string& p) {
  const CpuFeatures& cpu = cpu_features();
  const std::string here = "this CPU (" + cpu.isa_class() + ": " + cpu.flags() + ")";
  if (p == "mixed_bfloat16" || p == "bfloat16") {
    if (cpu.fast_bf16()) return "";
    return "dtype policy '" + p + "' on " + here +
           ", which has no AVX512-BF16 or AMX-BF16: bfloat16 matmuls run as float32 (upcast, float32 GEMM, "
           "rounded back), so expect no speed-up and bfloat16's rounding; float32 is as fast here";
  }
  if (p == "mixed_float16" || p == "float16")
    return "dtype policy '" + p +
           "' on a CPU: LibTorch 1.13 has no float16 GEMM on CPU (kiln runs it upcast to "
           "float32) and lacks float16 kernels for some ops (relu among them), so it is no faster than float32; use " +
           std::string(cpu.fast_bf16() ? "'mixed_bfloat16' (this CPU has native bf16)" : "'float32'") +
           " on CPU and keep mixed_float16 for GPUs";
  if (p == "int8") {
    if (cpu.int8_dot()) return "";
    return "int8 quantization on " + here +
           ", which has no AVX512-VNNI, AVX-VNNI or AMX-INT8: int8 products take several instructions each "
           "(fbgemm's kernel), and inputs with negative values are quantized to 7 bits there so that its int16 "
           "pair sums cannot saturate; `kiln quantize` prints the speed-up measured on this CPU";
  }
  if (p == "float8")
    return "float8 on CPU is emulated (values rounded to e4m3/e5m2, products in float32): it reproduces float8's "
           "numerics but runs slower than float32; float8 matmuls are fast only on GPUs with float8 tensor cores";
  return "";
}

void warn_if_slow(const std::string& p) {
  std::string w = precision_warning(p);
  if (!w.empty()) warn_once("precision:" + p, w);
}

}  // namespace kiln
