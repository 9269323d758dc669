// Model::quantize and the model-wide precision checks (see model.h).
#include <functional>
#include <set>

#include "kiln/core/cpu_features.h"
#include "kiln/core/error.h"
#include "kiln/models/calibration.h"
#include "kiln/models/model.h"

namespace kiln {
namespace {

// Calls `fn` on every non-model layer inside `root`, depth first.
void visit_leaves(const Layer& root, const std::function<void(Layer&)>& fn) {
  for (auto& l : root.sublayers()) {
    if (dynamic_cast<models::Model*>(l.get()) == nullptr &&
        (l->supports_quantization("int8") || l->sublayers().empty())) {
      fn(*l);
      continue;
    }
    visit_leaves(*l, fn);
  }
}

}  // namespace

bool models::Model::supports_quantization(const std::string& mode) const {
  bool any = false;
  visit_leaves(*this, [&](Layer& l) { any = any || l.supports_quantization(mode); });
  return any;
}

void models::Model::quantize(const std::string& mode) {
  if (mode != "int8" && mode != "float8" && mode != "int8_qat")
    throw ValueError("model.quantize: unknown mode '" + mode + "'; kiln knows int8, float8 and int8_qat");
  if (!built())
    throw StateError("model '" + name() + "' must be built before quantize(\"" + mode +
                     "\"): call it on data, or build it with the input shape, first");
  int quantized = 0;
  visit_leaves(*this, [&](Layer& l) {
    if (!l.supports_quantization(mode)) return;
    // int8 after quantization-aware training converts the trained layers.
    const std::string current = l.dtype_policy().quantization_mode();
    if (current == mode) return;
    l.quantize(mode);
    ++quantized;
  });
  if (quantized == 0)
    throw ValueError("model '" + name() + "' has no layer that supports quantize(\"" + mode +
                     "\") (int8: Dense, EinsumDense, Embedding; float8 and int8_qat: Dense, EinsumDense)");
}

std::string models::Model::quantization_summary() const {
  std::set<std::string> modes;
  visit_leaves(*this, [&](Layer& l) {
    if (l.dtype_policy().is_quantized()) modes.insert(l.dtype_policy().quantization_mode());
  });
  std::string s;
  for (auto& m : modes) s += (s.empty() ? "" : ", ") + m;
  return s;
}

// Warns once per process when a policy or quantization mode this model uses
// cannot run fast on this CPU (kiln/core/cpu_features.h).
void warn_about_slow_precision(const models::Model& model) {
  std::set<std::string> seen;
  auto check = [&](const DTypePolicy& p) {
    const std::string& src = p.source_name();
    if (seen.insert(src).second) warn_if_slow(src);
    if (p.is_quantized() && seen.insert(p.quantization_mode()).second) {
      const std::string m = p.quantization_mode() == "int8_qat" ? "" : p.quantization_mode();
      if (!m.empty()) warn_if_slow(m);
    }
  };
  check(model.dtype_policy());
  visit_leaves(model, [&](Layer& l) { check(l.dtype_policy()); });
}

void calibrate(models::Model& model, const Tensors& x, const quantization::CalibrationOptions& options,
               int64_t batch_size) {
  if (options.method != "minmax" && options.method != "percentile")
    throw ValueError("calibration method must be 'minmax' or 'percentile'. Received: '" + options.method + "'");
  if (!(options.percentile > 0 && options.percentile <= 100))
    throw ValueError("calibration percentile must be in (0, 100]. Received: " + std::to_string(options.percentile));
  bool any = false;
  visit_leaves(model, [&](Layer& l) {
    KernelImpl* impl = l.kernel_impl_ptr();
    any = any || (impl && impl->mode() == "int8");
  });
  if (!any)
    throw StateError("model '" + model.name() +
                     "' has no int8 Dense or EinsumDense layer to calibrate; call quantize(\"int8\") first");
  {
    quantization::CalibrationScope scope;
    model.predict(x, {.batch_size = batch_size});
  }
  visit_leaves(model, [&](Layer& l) { l.finish_calibration(options.method, options.percentile); });
}

}  // namespace kiln
