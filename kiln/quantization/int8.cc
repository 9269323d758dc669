#include "kiln/quantization/int8.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/quantized/PackedParams.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
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

enum class Kernel { kAuto, kOnednn, kFbgemm, kExact };

Kernel parse_kernel(const std::string& name) {
  if (name == "auto") return Kernel::kAuto;
  if (name == "onednn") return Kernel::kOnednn;
  if (name == "fbgemm") return Kernel::kFbgemm;
  if (name == "exact" || name == "libtorch") return Kernel::kExact;
  throw ValueError("int8 kernel must be 'auto', 'onednn', 'fbgemm' or 'exact'. Received: '" + name + "'");
}

std::atomic<Kernel>& kernel_setting() {
  static std::atomic<Kernel> setting{[] {
    const char* env = std::getenv("KILN_INT8_KERNEL");
    if (env == nullptr || *env == '\0') return Kernel::kAuto;
    try {
      return parse_kernel(env);
    } catch (const ValueError& e) {
      warn_once("KILN_INT8_KERNEL", std::string("KILN_INT8_KERNEL: ") + e.what() + "; using 'auto'");
      return Kernel::kAuto;
    }
  }()};
  return setting;
}

// oneDNN's int8 GEMM is exact only on CPUs with int8 dot-product
// instructions (AVX512-VNNI, AVX-VNNI, AMX). Without them (AVX2, AVX-512
// without VNNI) it multiplies with vpmaddubsw, which adds two u8 x s8
// products into a saturating int16 (2 x 255 x 127 = 64,770 > 32,767): on an
// AVX2 EPYC a 37x300x19 product of random int8 values came out wrong and
// quantized MLPs were off by 20-36% relative error.
bool onednn_usable() {
#ifdef KILN_HAVE_DNNL
  return cpu_features().int8_dot();
#else
  return false;
#endif
}

// oneDNN (the OpenMP build LibTorch also uses) opens a parallel region on
// every call, and with OMP_WAIT_POLICY=PASSIVE (kiln's default) that wakes
// sleeping threads: tens of microseconds, more than a one-row product takes.
// Small products therefore run on the calling thread only. OpenMP's thread
// count is per calling thread, so this does not touch other threads.
constexpr int64_t kSingleThreadMacs = int64_t{1} << 21;

at::Tensor exact_int8_matmul(const at::Tensor& a, const at::Tensor& b) {
  if (!a.device().is_cpu()) {
    // GPUs have no int32 GEMM. cuBLASLt's int8 one (at::_int_mm, int32
    // sums) takes M > 16 and K, N multiples of 8; other shapes go through
    // float64, exact while K * 127^2 < 2^53.
    if (a.size(0) > 16 && a.size(1) % 8 == 0 && b.size(1) % 8 == 0) return at::_int_mm(a.contiguous(), b.contiguous());
    return at::mm(a.to(at::kDouble), b.to(at::kDouble)).to(at::kInt);
  }
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

// --- fbgemm through LibTorch's quantized Linear ------------------------------
// quantized::linear_prepack packs a qint8 (N, K) weight for fbgemm (on the
// "x86" and "fbgemm" engines); the packed weight's
// apply_with_input_q_dq_qweight_dq_output_fp32(x, scale, zero_point)
// quantizes float x as round(x / scale) + zero_point into u8, runs fbgemm's
// GEMM and returns scale * weight_scale * (the integer sums) as float32.
// With scale 1, unit weight scales and x already integer-valued, that is
// the exact integer sum (as a float: exact below 2^24, K <= 1040).
using PackedLinear = c10::intrusive_ptr<LinearPackedParamsBase>;

PackedLinear fbgemm_prepack(const at::Tensor& w) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("quantized::linear_prepack", "")
                             .typed<PackedLinear(at::Tensor, std::optional<at::Tensor>)>();
  const int64_t n = w.size(1);
  at::Tensor q = at::_make_per_channel_quantized_tensor(w.t().contiguous(), at::ones({n}, at::kDouble),
                                                        at::zeros({n}, at::kLong), /*axis=*/0);
  return op.call(q, std::nullopt);
}

bool fbgemm_engine() {
  static const bool built = [] {
    const auto& engines = at::globalContext().supportedQEngines();
    return std::find(engines.begin(), engines.end(), at::QEngine::FBGEMM) != engines.end();
  }();
  if (!built) return false;
  const at::QEngine e = at::globalContext().qEngine();
  return e == at::QEngine::X86 || e == at::QEngine::FBGEMM;
}

// {fbgemm runs, it adds full 8-bit products exactly}: one worst-case
// product, measured rather than inferred from CPUID, since fbgemm picks its
// ISA itself (and FBGEMM_ENABLE_INSTRUCTIONS can force a narrower one).
// u8 255 x s8 127 pairs are what vpmaddubsw saturates.
std::pair<bool, bool> fbgemm_probe() {
  static const std::pair<bool, bool> r = []() -> std::pair<bool, bool> {
    if (!fbgemm_engine()) return {false, false};
    try {
      const int64_t k = 64;
      PackedLinear w = fbgemm_prepack(at::full({k, 8}, 127, at::kChar));
      bool wide = true;
      for (int64_t m : {1, 37}) {
        at::Tensor y = w->apply_with_input_q_dq_qweight_dq_output_fp32(at::full({m, k}, 127.0f), 1.0, 128);
        wide = wide && y.eq(static_cast<float>(k * 127 * 127)).all().item<bool>();
      }
      return {true, wide};
    } catch (const std::exception&) {
      return {false, false};  // a LibTorch without fbgemm's quantized Linear
    }
  }();
  return r;
}

// The rows of x as fbgemm's float input, which it rounds to kiln's integer
// values: {values, scale (M, 1), row offset (M, 1) or undefined, zero
// point}. Wide: kiln's 8-bit symmetric values, zero point 128 (u8 1..255).
// Narrow (pairs summed in int16): u8 must stay within 0..127. A row without
// negative values keeps kiln's 8-bit values 0..127; a row with negative
// values is quantized to +-63 with 63 / (max|x| + 1e-7), zero point 64.
// When both kinds meet in one batch, zero point 64 for all and the first
// kind passed as q - 64, restored by adding 64 x the column sums. Small
// inputs take loops, large ones ATen's kernels, with the same float
// arithmetic: the same integers reach the GEMM.
struct FbgemmInput {
  at::Tensor q, scale, offset;
  int64_t zero_point;
};

constexpr int64_t kSmallElements = 16384;  // as quantize_rows below
constexpr float kNarrowRatio = 63.0f / 127.0f;

FbgemmInput fbgemm_input(const at::Tensor& x_in, const at::Tensor& static_scale, bool wide) {
  at::Tensor x = x_in.to(at::kFloat).contiguous();
  const int64_t m = x.size(0), k = x.size(1);
  FbgemmInput in;
  in.zero_point = wide ? 128 : 64;
  const float eps = static_cast<float>(kInt8Epsilon);
  if (m * k <= kSmallElements) {
    in.q = at::empty({m, k}, x.options());
    in.scale = at::empty({m, 1}, x.options());
    if (!wide) in.offset = at::empty({m, 1}, x.options());
    const bool fixed_scale = static_scale.defined();
    const float fixed = fixed_scale ? static_scale.to(at::kFloat).item<float>() : 0.0f;
    const float* xp = x.data_ptr<float>();
    float* qp = in.q.data_ptr<float>();
    for (int64_t i = 0; i < m; ++i) {
      const float* row = xp + i * k;
      float amax = 0.0f, lowest = 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        amax = std::max(amax, std::fabs(row[j]));
        lowest = std::min(lowest, row[j]);
      }
      const bool full = wide || lowest >= 0.0f;
      float s = 0.0f;
      if (fixed_scale)
        s = full ? fixed : fixed * kNarrowRatio;
      else
        s = (full ? 127.0f : 63.0f) / (amax + eps);
      const float lo = wide ? -127.0f : (full ? 0.0f : -63.0f), hi = full ? 127.0f : 63.0f;
      const float off = !wide && full ? 64.0f : 0.0f;
      in.scale.data_ptr<float>()[i] = s;
      if (!wide) in.offset.data_ptr<float>()[i] = off;
      for (int64_t j = 0; j < k; ++j) qp[i * k + j] = std::min(hi, std::max(lo, std::nearbyint(row[j] * s))) - off;
    }
    return in;
  }
  // fbgemm rounds (ties to even, as at::round) and clamps to u8 itself:
  // scaled values within range need neither pass here (round(clamp(v)) =
  // clamp(round(v)) for integer bounds).
  const bool fixed_scale = static_scale.defined();
  at::Tensor fixed = fixed_scale ? static_scale.to(at::kFloat).reshape({1, 1}).expand({m, 1}) : at::Tensor();
  if (wide && fixed_scale) {
    in.scale = fixed;
    in.q = (x * fixed).clamp_(-127, 127);
    return in;
  }
  if (wide) {
    in.scale = 127.0 / (x.abs().amax({1}, /*keepdim=*/true) + kInt8Epsilon);
    in.q = x * in.scale;
    return in;
  }
  // max|x| = max(highest, -lowest); two vectorized reductions (at::aminmax
  // along rows took 15x as long here).
  at::Tensor lowest = x.amin({1}, /*keepdim=*/true);
  at::Tensor amax = at::maximum(x.amax({1}, /*keepdim=*/true), lowest.neg()) + kInt8Epsilon;
  at::Tensor full = lowest.ge(0);  // no negative value in the row
  in.scale = fixed_scale ? at::where(full, fixed, fixed * kNarrowRatio) : at::where(full, 127.0 / amax, 63.0 / amax);
  in.q = x * in.scale;
  const int64_t full_rows = full.sum().item<int64_t>();
  if (full_rows == m || full_rows == 0) {  // one range for all rows: no offsets
    in.zero_point = full_rows == m ? 0 : 64;
    if (fixed_scale && full_rows == m)
      in.q.clamp_(0, 127);
    else if (fixed_scale)
      in.q.clamp_(-63, 63);
    return in;
  }
  at::Tensor f = full.to(at::kFloat);
  in.offset = f * 64;
  in.q.round_();
  in.q.clamp_(f * 63 - 63, f * 64 + 63);  // 0..127 or -63..63
  in.q.sub_(in.offset);
  return in;
}

// dequantize_product, with an optional row offset (M, 1) times col_sum (N)
// added to the sums first; acc int32 or float (integer-valued).
at::Tensor dequantize(const at::Tensor& acc, const at::Tensor& row_scale, const at::Tensor& col_scale,
                      const at::Tensor& bias, const at::Tensor& row_offset, const at::Tensor& col_sum) {
  at::NoGradGuard ng;
  const int64_t m = acc.size(0), n = acc.size(1);
  if (m * n <= kSmallElements && acc.device().is_cpu()) {
    at::Tensor a = acc.contiguous(), rs = row_scale.to(at::kFloat).contiguous();
    at::Tensor cs = col_scale.to(at::kFloat).reshape({-1}).contiguous();
    at::Tensor b = bias.defined() ? bias.detach().to(at::kFloat).reshape({-1}).contiguous() : at::Tensor();
    at::Tensor ro = row_offset.defined() ? row_offset.contiguous() : at::Tensor();
    at::Tensor y = at::empty({m, n}, a.options().dtype(at::kFloat));
    const float *rp = rs.data_ptr<float>(), *cp = cs.data_ptr<float>();
    const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
    const float* op = ro.defined() ? ro.data_ptr<float>() : nullptr;
    const float* sp = ro.defined() ? col_sum.data_ptr<float>() : nullptr;
    float* yp = y.data_ptr<float>();
    const bool per_row = rs.numel() != 1;
    auto run = [&](const auto* ap) {
      for (int64_t i = 0; i < m; ++i) {
        const float r = per_row ? rp[i] : rp[0];
        const float o = op ? op[i] : 0.0f;
        for (int64_t j = 0; j < n; ++j) {
          float v = static_cast<float>(ap[i * n + j]);
          if (o != 0.0f) v += o * sp[j];
          v /= r * cp[j];
          yp[i * n + j] = bp ? v + bp[j] : v;
        }
      }
    };
    if (a.scalar_type() == at::kInt)
      run(a.data_ptr<int32_t>());
    else
      run(a.data_ptr<float>());
    return y;
  }
  // Keras's order: acc / (inputs_scale * kernel_scale), then the bias.
  at::Tensor y = acc.to(at::kFloat);
  if (row_offset.defined()) y.addr_(row_offset.reshape({-1}), col_sum);
  y.div_(row_scale.to(at::kFloat) * col_scale.to(at::kFloat).reshape({1, -1}));
  if (bias.defined()) y.add_(bias.detach().to(at::kFloat));
  return y;
}

// The kernel `auto` picks for `m` rows, from bench/precision_bench on an
// AVX512-VNNI EPYC (docs/PERFORMANCE.md): there fbgemm and oneDNN give the
// same bits; fbgemm is as fast or faster below 128 rows (7% at batch 32 for
// the 4 x Dense(1024) MLP) and needs no set-up per batch size, oneDNN is
// 5-8% faster from 128 rows. Without VNNI fbgemm is the only fast exact
// kernel. oneDNN keeps the CPUs where fbgemm lacks instructions oneDNN uses
// (not measured here): AMX tiles, and AVX-VNNI without AVX-512 (fbgemm uses
// VNNI only as AVX512-VNNI). A CPU never mixes kernels with different
// numerics across batch sizes.
constexpr int64_t kOnednnMinRows = 128;

Kernel auto_kernel(int64_t m) {
  const bool fbgemm = fbgemm_probe().first && fbgemm_engine();
  if (!fbgemm) return onednn_usable() ? Kernel::kOnednn : Kernel::kExact;
  if (!onednn_usable()) return Kernel::kFbgemm;
  if (cpu_features().amx_int8 || !fbgemm_probe().second) return Kernel::kOnednn;
  return m >= kOnednnMinRows ? Kernel::kOnednn : Kernel::kFbgemm;
}

Kernel pick_kernel(int64_t m) {
  switch (kernel_setting().load()) {
    case Kernel::kOnednn:
      return onednn_usable() ? Kernel::kOnednn : Kernel::kExact;
    case Kernel::kFbgemm:
      return fbgemm_available() ? Kernel::kFbgemm : Kernel::kExact;
    case Kernel::kExact:
      return Kernel::kExact;
    case Kernel::kAuto:
      break;
  }
  return auto_kernel(m);
}

const char* kernel_name(Kernel k) {
  switch (k) {
    case Kernel::kOnednn:
      return "onednn";
    case Kernel::kFbgemm:
      return "fbgemm";
    case Kernel::kExact:
      return "exact";
    case Kernel::kAuto:
      break;
  }
  return "auto";
}

}  // namespace

// What Int8Weights prepared, per kernel, made on first use: oneDNN's
// primitive and reordered weights per batch size M; fbgemm's packed weights
// and the weights' column sums (for narrow rows' offsets).
struct Int8Weights::Packed {
#ifdef KILN_HAVE_DNNL
  struct Entry {
    dnnl::matmul prim;
    dnnl::memory::desc a, c;
    dnnl::memory weights;
  };
  std::map<int64_t, std::shared_ptr<Entry>> by_m;  // guarded by mu
#endif
  struct Fbgemm {
    PackedLinear w;
    at::Tensor col_sum;  // (N) float
  };
  std::shared_ptr<const Fbgemm> fbgemm;  // guarded by mu
  std::mutex mu;
};

Int8Weights::Int8Weights(const at::Tensor& w) : w_(w.contiguous()), packed_(std::make_shared<Packed>()) {
  if (w_.dim() != 2 || w_.scalar_type() != at::kChar) throw ShapeError("Int8Weights needs a (K, N) int8 matrix");
}

namespace {

// Small products run on the calling thread (kSingleThreadMacs).
void cap_small(std::optional<IntraOpThreadCap>& single, int64_t m, int64_t k, int64_t n) {
  if (m * k * n <= kSingleThreadMacs) single.emplace(1, IntraOpThreadCap::Blas::kLeave);
}

}  // namespace

at::Tensor Int8Weights::matmul(const at::Tensor& a_in) const {
  if (a_in.dim() != 2 || a_in.size(1) != w_.size(0) || a_in.scalar_type() != at::kChar)
    throw ShapeError("Int8Weights::matmul needs an (M, K) int8 matrix with K = " + std::to_string(w_.size(0)));
  const int64_t m = a_in.size(0);
  const Kernel kernel = a_in.device().is_cpu() && m > 0 ? pick_kernel(m) : Kernel::kExact;
  if (kernel == Kernel::kOnednn) return onednn_matmul(a_in);
  // fbgemm sums int8 values exactly only where its inputs are wide, and
  // returns them as floats: exact while K x 127^2 < 2^24.
  if (kernel == Kernel::kFbgemm && fbgemm_wide_inputs() && w_.size(0) * 127 * 127 < (int64_t{1} << 24))
    return fbgemm_sums(a_in.to(at::kFloat), 128).to(at::kInt);
  return exact_int8_matmul(a_in, w_);
}

at::Tensor Int8Weights::onednn_matmul(const at::Tensor& a_in) const {
#ifdef KILN_HAVE_DNNL
  const int64_t m = a_in.size(0), k = w_.size(0), n = w_.size(1);
  at::Tensor a = a_in.contiguous();
  // Created and run under the same thread count: oneDNN plans a
  // primitive's parallel split when it creates it.
  std::optional<IntraOpThreadCap> single;
  cap_small(single, m, k, n);
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
#else
  return exact_int8_matmul(a_in, w_);
#endif
}

at::Tensor Int8Weights::fbgemm_sums(const at::Tensor& q, int64_t zero_point) const {
  std::shared_ptr<const Packed::Fbgemm> f;
  {
    std::lock_guard<std::mutex> l(packed_->mu);
    if (!packed_->fbgemm) {
      auto made = std::make_shared<Packed::Fbgemm>();
      made->w = fbgemm_prepack(w_);
      made->col_sum = w_.sum(0, /*keepdim=*/false, at::kFloat);
      packed_->fbgemm = made;
    }
    f = packed_->fbgemm;
  }
  std::optional<IntraOpThreadCap> single;
  cap_small(single, q.size(0), w_.size(0), w_.size(1));
  return f->w->apply_with_input_q_dq_qweight_dq_output_fp32(q, 1.0, zero_point);
}

at::Tensor Int8Weights::dense(const at::Tensor& x, const at::Tensor& static_scale, const at::Tensor& col_scale,
                              const at::Tensor& bias) const {
  at::NoGradGuard ng;
  if (x.dim() != 2 || x.size(1) != w_.size(0))
    throw ShapeError("Int8Weights::dense needs an (M, K) matrix with K = " + std::to_string(w_.size(0)));
  const int64_t m = x.size(0);
  const Kernel kernel = x.device().is_cpu() && m > 0 ? pick_kernel(m) : Kernel::kExact;
  if (kernel != Kernel::kFbgemm) {
    auto [xq, xs] = quantize_rows(x, static_scale);
    at::Tensor acc = kernel == Kernel::kOnednn ? onednn_matmul(xq) : exact_int8_matmul(xq, w_);
    return dequantize_product(acc, xs, col_scale, bias);
  }
  FbgemmInput in = fbgemm_input(x, static_scale, fbgemm_wide_inputs());
  at::Tensor acc = fbgemm_sums(in.q, in.zero_point);
  at::Tensor col_sum;
  if (in.offset.defined()) {
    std::lock_guard<std::mutex> l(packed_->mu);
    col_sum = packed_->fbgemm->col_sum;
  }
  return dequantize(acc, in.scale, col_scale, bias, in.offset, col_sum);
}

// Large inputs go through ATen's vectorized kernels, which beat hand-written
// loops there (bench/precision_bench --int8_parts). Small ones (a served row)
// go through plain loops: a dozen ATen calls cost more in dispatch than the
// arithmetic (one-row REST latency of the demo MLP fell from 0.40 to 0.24
// ms with this and the single-thread GEMM below). Both give the same float32
// results bit for bit: the same operations in the same order.
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
  return dequantize(acc, row_scale, col_scale, bias, at::Tensor(), at::Tensor());
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

std::string int8_backend(int64_t batch) { return kernel_name(pick_kernel(std::max<int64_t>(batch, 1))); }

std::string set_int8_backend(const std::string& name) {
  return kernel_name(kernel_setting().exchange(parse_kernel(name)));
}

bool fbgemm_available() { return fbgemm_probe().first && fbgemm_engine(); }

bool fbgemm_wide_inputs() { return fbgemm_available() && fbgemm_probe().second; }

}  // namespace kiln::quantization
