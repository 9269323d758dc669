#include "kiln/core/threads.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <strings.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "kiln/core/error.h"

namespace kiln {
namespace {

using SetThreadsFn = void (*)(int);
using GetThreadsFn = int (*)();

// OpenBLAS is loaded through LibTorch; find its thread API at run time so
// kiln does not link against a specific BLAS.
template <class Fn>
Fn blas_symbol(const char* name) {
  return reinterpret_cast<Fn>(::dlsym(RTLD_DEFAULT, name));
}

int env_threads() {
  const char* v = std::getenv("KILN_NUM_THREADS");
  if (!v || !*v) return 0;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n <= 0 || n > 1024)
    throw ValueError(std::string("KILN_NUM_THREADS must be a positive integer. Received: ") + v);
  return (int)n;
}

std::once_flag g_interop_once;

}  // namespace

void prepare_thread_environment(char** argv, ThreadProfile profile) {
  bool changed = false;
  auto set_default = [&](const char* name, const char* value) {
    if (std::getenv(name) != nullptr) return;
    ::setenv(name, value, 1);
    changed = true;
  };
  set_default("OMP_WAIT_POLICY", "PASSIVE");
  if (profile == ThreadProfile::kServing) set_default("OPENBLAS_THREAD_TIMEOUT", "4");
  if (!changed) return;
  ::execv("/proc/self/exe", argv);
  // exec failed: carry on with the defaults (configure_threads then keeps
  // OpenBLAS to one thread).
}

bool omp_threads_passive() {
  const char* v = std::getenv("OMP_WAIT_POLICY");
  return v && ::strcasecmp(v, "passive") == 0;
}

int configure_threads(ThreadConfig cfg) {
  int n = cfg.intra_op > 0 ? cfg.intra_op : env_threads();
  if (n <= 0) n = (int)std::max(1u, std::thread::hardware_concurrency());
  const int blas = omp_threads_passive() ? n : 1;
  if (auto set_blas = blas_symbol<SetThreadsFn>("openblas_set_num_threads")) set_blas(blas);
  at::set_num_threads(n);
  std::call_once(g_interop_once, [&] {
    try {
      at::set_num_interop_threads(std::max(1, cfg.inter_op));
    } catch (const std::exception&) {
      // Already started by earlier tensor work; harmless.
    }
  });
  return n;
}

int num_threads() { return at::get_num_threads(); }

namespace {

// BLAS_INFO=<name> in LibTorch's build settings (at::show_config()).
std::string blas_info() {
  const std::string config = at::show_config();
  const std::string key = "BLAS_INFO=";
  const auto at = config.find(key);
  if (at == std::string::npos) return "";
  const auto end = config.find_first_of(", \n", at + key.size());
  return config.substr(at + key.size(), end == std::string::npos ? std::string::npos : end - at - key.size());
}

}  // namespace

BlasLibrary blas_library() {
  static const BlasLibrary lib = [] {
    const std::string info = blas_info();
    if (info == "mkl") return BlasLibrary::kMkl;
    if (info.rfind("open", 0) == 0 || blas_symbol<GetThreadsFn>("openblas_get_num_threads"))
      return BlasLibrary::kOpenBlas;
    return BlasLibrary::kOther;
  }();
  return lib;
}

const char* blas_library_name() {
  static const std::string name = [] {
    switch (blas_library()) {
      case BlasLibrary::kOpenBlas:
        return std::string("OpenBLAS");
      case BlasLibrary::kMkl:
        return std::string("MKL");
      default:
        break;
    }
    const std::string info = blas_info();
    return info.empty() ? std::string("unknown") : info;
  }();
  return name.c_str();
}

int blas_num_threads() {
  // dlsym is a symbol search: once each.
  static const auto openblas = blas_symbol<GetThreadsFn>("openblas_get_num_threads");
  static const auto mkl = blas_symbol<GetThreadsFn>("mkl_get_max_threads");
  if (openblas) return openblas();
  if (mkl) return mkl();
  return 0;
}

namespace {

// MKL's count for the calling thread only (0: back to MKL's global count,
// which at::set_num_threads sets); returns the thread's setting before. MKL
// does not follow omp_set_num_threads: without this, a GEMM on a thread
// capped to one OpenMP thread still ran on every core.
using MklSetLocalFn = int (*)(int);
MklSetLocalFn mkl_set_local() {
  static const auto f = blas_symbol<MklSetLocalFn>("MKL_Set_Num_Threads_Local");
  return f;
}

}  // namespace

int set_thread_intra_op_threads(int n) {
  if (n < 1)
    throw ValueError("set_thread_intra_op_threads: the count must be at least 1. Received: " + std::to_string(n));
  // From the OpenMP runtime LibTorch loaded (no link of kiln's own, so GCC and
  // clang builds share one runtime).
  static const auto set_omp = blas_symbol<SetThreadsFn>("omp_set_num_threads");
  if (!set_omp) return 0;
  const int before = at::get_num_threads();  // ATen's first-use set-up runs here
  if (before != n) set_omp(n);
  if (auto mkl = mkl_set_local()) mkl(n);
  return before;
}

IntraOpThreadCap::IntraOpThreadCap(int n, Blas blas_cap) {
  if (n < 1) throw ValueError("IntraOpThreadCap: the cap must be at least 1. Received: " + std::to_string(n));
  static const auto set_blas = blas_symbol<SetThreadsFn>("openblas_set_num_threads");
  static const auto set_omp = blas_symbol<SetThreadsFn>("omp_set_num_threads");
  if (set_omp && at::get_num_threads() > n) {
    omp_before_ = at::get_num_threads();
    set_omp(n);
  }
  if (blas_cap == Blas::kLeave) return;
  const int blas = blas_num_threads();
  if (blas <= n) return;
  if (set_blas) {
    set_blas(n);
    blas_before_ = blas;
  } else if (auto mkl = mkl_set_local()) {
    mkl_local_before_ = mkl(n);
  }
}

IntraOpThreadCap::~IntraOpThreadCap() {
  static const auto set_blas = blas_symbol<SetThreadsFn>("openblas_set_num_threads");
  static const auto set_omp = blas_symbol<SetThreadsFn>("omp_set_num_threads");
  if (omp_before_ > 0) set_omp(omp_before_);
  if (blas_before_ > 0) set_blas(blas_before_);
  if (mkl_local_before_ >= 0) mkl_set_local()(mkl_local_before_);
}

}  // namespace kiln
