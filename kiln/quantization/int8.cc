#include "kiln/quantization/int8.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>

#include "kiln/core/cpu_features.h"
#include "kiln/core/error.h"
#include "kiln/core/threads.h"

#ifdef KILN_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace kiln::quantization {
namespace {

std::atomic<bool> g_use_libtorch{false};

// oneDNN's int8 GEMM is exact only on CPUs with int8 dot-product
// instructions (AVX512-VNNI, AVX-VNNI, AMX). Without them (AVX2, AVX-512
// without VNNI) it multiplies with vpmaddubsw, which adds two u8 x s8
// products into a saturating int16 (2 x 255 x 127 = 64,770 > 32,767): on an
// AVX2 EPYC a 37x300x19 product of random int8 values came out wrong and
// quantized MLPs were off by 20-36% relative error. There kiln keeps to
// LibTorch's exact int32 GEMM, as PyTorch's x86 quantization narrows its
// activations to 7 bits (reduce_range) for the same reason.
bool use_onednn() { return !g_use_libtorch.load() && cpu_features().int8_dot(); }

// oneDNN (the OpenMP build LibTorch also uses) opens a parallel region on
// every call, and with OMP_WAIT_POLICY=PASSIVE (kiln's default) that wakes
// sleeping threads: tens of microseconds, more than a one-row product takes.
// Small products therefore run on the calling thread only. OpenMP's thread
// count is per calling thread, so this does not touch other threads.
constexpr int64_t kSingleThreadMacs = int64_t{1} << 21;

at::Tensor libtorch_int8_matmul(const at::Tensor& a, const at::Tensor& b) {
  // int32 operands: LibTorch's CPU integer GEMM accumulates exactly in int32
  // (K * 127 * 127 stays far below 2^31 for any realistic K).
  return at::mm(a.to(at::kInt), b.to(at::kInt));
}

#ifdef KILN_HAVE_DNNL

dnnl::engine& cpu_engine() {
  static dnnl::engine* e = new dnnl::engine(dnnl::engine::kind::cpu, 0);  // never destroyed, as above
  return *e;
}
#endif

}  // namespace

#ifdef KILN_HAVE_DNNL
// Per batch size M: the primitive (weights in the layout it chose) and the
// weights reordered into that layout.
struct Int8Weights::Packed {
  struct Entry {
    dnnl::matmul prim;
    dnnl::memory::desc a, c;
    dnnl::memory weights;
  };
  std::mutex mu;
  std::map<int64_t, std::shared_ptr<Entry>> by_m;  // guarded by mu
};
#else
struct Int8Weights::Packed {};
#endif

Int8Weights::Int8Weights(const at::Tensor& w) : w_(w.contiguous()), packed_(std::make_shared<Packed>()) {
  if (w_.dim() != 2 || w_.scalar_type() != at::kChar) throw ShapeError("Int8Weights needs a (K, N) int8 matrix");
}

at::Tensor Int8Weights::matmul(const at::Tensor& a_in) const {
  if (a_in.dim() != 2 || a_in.size(1) != w_.size(0) || a_in.scalar_type() != at::kChar)
    throw ShapeError("Int8Weights::matmul needs an (M, K) int8 matrix with K = " + std::to_string(w_.size(0)));
#ifdef KILN_HAVE_DNNL
  if (use_onednn() && a_in.device().is_cpu() && a_in.size(0) > 0) {
    const int64_t m = a_in.size(0), k = w_.size(0), n = w_.size(1);
    at::Tensor a = a_in.contiguous();
    // Created and run under the same thread count: oneDNN plans a
    // primitive's parallel split when it creates it.
    std::optional<IntraOpThreadCap> single;
    if (m * k * n <= kSingleThreadMacs) single.emplace(1, IntraOpThreadCap::Blas::kLeave);
    std::shared_ptr<Packed::Entry> e;
    {
      std::lock_guard<std::mutex> l(packed_->mu);
      auto& slot = packed_->by_m[m];
      if (!slot) {
        using dt = dnnl::memory::data_type;
        using tag = dnnl::memory::format_tag;
        auto entry = std::make_shared<Packed::Entry>();
        entry->a = dnnl::memory::desc({m, k}, dt::s8, tag::ab);
        entry->c = dnnl::memory::desc({m, n}, dt::s32, tag::ab);
        dnnl::memory::desc b_any({k, n}, dt::s8, tag::any);
        dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(entry->a, b_any, entry->c), cpu_engine());
        entry->prim = dnnl::matmul(pd);
        dnnl::memory plain({{k, n}, dt::s8, tag::ab}, cpu_engine(), w_.data_ptr());
        entry->weights = dnnl::memory(pd.weights_desc(), cpu_engine());
        dnnl::stream s(cpu_engine());
        dnnl::reorder(plain, entry->weights).execute(s, plain, entry->weights);
        s.wait();
        if (packed_->by_m.size() > 64) {  // bounded: batch sizes vary
          packed_->by_m.clear();
          packed_->by_m[m] = entry;
        } else {
          slot = entry;
        }
        e = entry;
      } else {
        e = slot;
      }
    }
    at::Tensor out = at::empty({m, n}, a.options().dtype(at::kInt));
    dnnl::stream s(cpu_engine());
    dnnl::memory am(e->a, cpu_engine(), a.data_ptr()), cm(e->c, cpu_engine(), out.data_ptr());
    e->prim.execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, e->weights}, {DNNL_ARG_DST, cm}});
    s.wait();
    return out;
  }
#endif
  return libtorch_int8_matmul(a_in, w_);
}

// Large inputs go through ATen's vectorized kernels, which beat hand-written
// loops there (bench/precision_bench --int8_parts). Small ones (a served row)
// go through plain loops: a dozen ATen calls cost more in dispatch than the
// arithmetic (one-row REST latency of the demo MLP fell from 0.40 to 0.24
// ms with this and the single-thread GEMM below). Both give the same float32
// results bit for bit: the same operations in the same order.
constexpr int64_t kSmallElements = 16384;

std::pair<at::Tensor, at::Tensor> quantize_rows(const at::Tensor& x_in, const at::Tensor& static_scale) {
  at::NoGradGuard ng;
  at::Tensor x = x_in.to(at::kFloat);
  const int64_t m = x.size(0), k = x.size(1);
  if (m * k <= kSmallElements && x.device().is_cpu()) {
    x = x.contiguous();
    at::Tensor q = at::empty({m, k}, x.options().dtype(at::kChar));
    at::Tensor scale = at::empty({m, 1}, x.options());
    const float fixed = static_scale.defined() ? static_scale.to(at::kFloat).item<float>() : 0.0f;
    const float* xp = x.data_ptr<float>();
    int8_t* qp = q.data_ptr<int8_t>();
    for (int64_t i = 0; i < m; ++i) {
      const float* row = xp + i * k;
      float s = fixed;
      if (!static_scale.defined()) {
        float amax = 0.0f;
        for (int64_t j = 0; j < k; ++j) amax = std::max(amax, std::fabs(row[j]));
        s = 127.0f / (amax + static_cast<float>(kInt8Epsilon));
      }
      scale.data_ptr<float>()[i] = s;
      for (int64_t j = 0; j < k; ++j) {
        const float r = std::nearbyint(row[j] * s);  // ties to even, as at::round
        qp[i * k + j] = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, r)));
      }
    }
    return {q, scale};
  }
  at::Tensor scale;
  if (static_scale.defined())
    scale = static_scale.to(at::kFloat).reshape({1, 1}).expand({m, 1});
  else
    scale = 127.0 / (x.abs().amax({1}, /*keepdim=*/true) + kInt8Epsilon);
  at::Tensor q = x * scale;
  q.round_().clamp_(-127, 127);
  return {q.to(at::kChar), scale};
}

at::Tensor dequantize_product(const at::Tensor& acc, const at::Tensor& row_scale, const at::Tensor& col_scale,
                              const at::Tensor& bias) {
  at::NoGradGuard ng;
  const int64_t m = acc.size(0), n = acc.size(1);
  if (m * n <= kSmallElements && acc.device().is_cpu()) {
    at::Tensor a = acc.contiguous(), rs = row_scale.to(at::kFloat).contiguous();
    at::Tensor cs = col_scale.to(at::kFloat).reshape({-1}).contiguous();
    at::Tensor b = bias.defined() ? bias.detach().to(at::kFloat).reshape({-1}).contiguous() : at::Tensor();
    at::Tensor y = at::empty({m, n}, a.options().dtype(at::kFloat));
    const int32_t* ap = a.data_ptr<int32_t>();
    const float *rp = rs.data_ptr<float>(), *cp = cs.data_ptr<float>();
    const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
    float* yp = y.data_ptr<float>();
    const bool per_row = rs.numel() != 1;
    for (int64_t i = 0; i < m; ++i) {
      const float r = per_row ? rp[i] : rp[0];
      for (int64_t j = 0; j < n; ++j) {
        const float v = static_cast<float>(ap[i * n + j]) / (r * cp[j]);
        yp[i * n + j] = bp ? v + bp[j] : v;
      }
    }
    return y;
  }
  // Keras's order: acc / (inputs_scale * kernel_scale), then the bias.
  at::Tensor y = acc.to(at::kFloat);
  y.div_(row_scale.to(at::kFloat) * col_scale.to(at::kFloat).reshape({1, -1}));
  if (bias.defined()) y.add_(bias.detach().to(at::kFloat));
  return y;
}

std::pair<at::Tensor, at::Tensor> abs_max_quantize(const at::Tensor& x, const std::vector<int64_t>& axes) {
  at::NoGradGuard ng;
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor amax = xf.abs().amax(axes, /*keepdim=*/true);
  at::Tensor scale = 127.0 / (amax + kInt8Epsilon);
  return {quantize_with_scale(xf, scale), scale};
}

at::Tensor quantize_with_scale(const at::Tensor& x, const at::Tensor& scale) {
  at::NoGradGuard ng;
  return at::clamp(at::round(x.to(at::kFloat) * scale), -127, 127).to(at::kChar);
}

at::Tensor int8_matmul(const at::Tensor& a, const at::Tensor& b) {
  if (a.dim() != 2 || b.dim() != 2 || a.size(1) != b.size(0) || a.scalar_type() != at::kChar ||
      b.scalar_type() != at::kChar)
    throw ShapeError("int8_matmul needs (M, K) and (K, N) int8 matrices");
  // One product: the weights are prepared for it alone.
  return Int8Weights(b).matmul(a);
}

std::string int8_backend() {
#ifdef KILN_HAVE_DNNL
  if (use_onednn()) return "onednn";
#endif
  return "libtorch";
}

void set_int8_backend(const std::string& name) {
  if (name != "onednn" && name != "libtorch")
    throw ValueError("int8 backend must be 'onednn' or 'libtorch'. Received: '" + name + "'");
  g_use_libtorch.store(name == "libtorch");
}

}  // namespace kiln::quantization
