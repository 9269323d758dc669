#include "kiln/quantization/int8.h"

#include <atomic>
#include <map>
#include <mutex>
#include <tuple>

#include "kiln/core/error.h"

#ifdef KILN_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace kiln::quantization {
namespace {

std::atomic<bool> g_use_libtorch{false};

at::Tensor libtorch_int8_matmul(const at::Tensor& a, const at::Tensor& b) {
  // int32 operands: LibTorch's CPU integer GEMM accumulates exactly in int32
  // (K * 127 * 127 stays far below 2^31 for any realistic K).
  return at::mm(a.to(at::kInt), b.to(at::kInt));
}

#ifdef KILN_HAVE_DNNL
struct Gemm {
  dnnl::matmul prim;
  dnnl::memory::desc a, b, c;
};

class OneDnn {
 public:
  OneDnn() : engine_(dnnl::engine::kind::cpu, 0) {}

  at::Tensor matmul(const at::Tensor& a, const at::Tensor& b) {
    const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
    const Gemm& g = gemm(m, k, n);
    at::Tensor out = at::empty({m, n}, a.options().dtype(at::kInt));
    dnnl::stream stream(engine_);
    dnnl::memory am(g.a, engine_, a.data_ptr()), bm(g.b, engine_, b.data_ptr()), cm(g.c, engine_, out.data_ptr());
    g.prim.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    stream.wait();
    return out;
  }

 private:
  const Gemm& gemm(int64_t m, int64_t k, int64_t n) {
    std::lock_guard<std::mutex> l(mu_);
    auto key = std::make_tuple(m, k, n);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    Gemm g;
    g.a = dnnl::memory::desc({m, k}, dt::s8, tag::ab);
    g.b = dnnl::memory::desc({k, n}, dt::s8, tag::ab);
    g.c = dnnl::memory::desc({m, n}, dt::s32, tag::ab);
    dnnl::matmul::desc d(g.a, g.b, g.c);
    g.prim = dnnl::matmul(dnnl::matmul::primitive_desc(d, engine_));
    if (cache_.size() > 256) cache_.clear();  // bounded: shapes vary with the batch size
    return cache_.emplace(key, std::move(g)).first->second;
  }

  dnnl::engine engine_;
  std::mutex mu_;
  std::map<std::tuple<int64_t, int64_t, int64_t>, Gemm> cache_;  // guarded by mu_
};

OneDnn& onednn() {
  static OneDnn* o = new OneDnn();  // never destroyed: used from server threads until exit
  return *o;
}
#endif

}  // namespace

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
#ifdef KILN_HAVE_DNNL
  if (!g_use_libtorch.load() && a.device().is_cpu() && b.device().is_cpu() && a.size(0) > 0)
    return onednn().matmul(a.contiguous(), b.contiguous());
#endif
  return libtorch_int8_matmul(a, b);
}

std::string int8_backend() {
#ifdef KILN_HAVE_DNNL
  if (!g_use_libtorch.load()) return "onednn";
#endif
  return "libtorch";
}

void set_int8_backend(const std::string& name) {
  if (name != "onednn" && name != "libtorch")
    throw ValueError("int8 backend must be 'onednn' or 'libtorch'. Received: '" + name + "'");
  g_use_libtorch.store(name == "libtorch");
}

}  // namespace kiln::quantization
