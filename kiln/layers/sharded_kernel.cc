#include "kiln/layers/sharded_kernel.h"

#include <torch/csrc/autograd/custom_function.h>

#include <set>

#include "kiln/core/error.h"
#include "kiln/layers/layer.h"

namespace kiln {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

Distribution& active(const std::string& what) {
  auto d = distribution();
  if (!d) throw StateError(what + " needs the distribution that sharded the variables; it is no longer set");
  return *d;
}

at::Tensor own_part(const at::Tensor& x, int64_t dim, const std::string& axis) {
  Distribution& d = active("slicing along mesh axis '" + axis + "'");
  const int64_t n = d.mesh_axis_size(axis), i = d.mesh_axis_index(axis);
  const int64_t size = x.size(dim);
  if (size % n)
    throw ShapeError("dimension " + std::to_string(dim) + " of size " + std::to_string(size) +
                     " cannot be split evenly over the " + std::to_string(n) + " ranks of mesh axis '" + axis + "'");
  return x.narrow(dim, i * (size / n), size / n);
}

at::Tensor all_reduced(const at::Tensor& x, const std::string& axis) {
  at::Tensor t = x.contiguous().clone();
  active("an all-reduce along mesh axis '" + axis + "'").axis_all_reduce_sum(t, axis);
  return t;
}

at::Tensor all_gathered(const at::Tensor& x, int64_t dim, const std::string& axis) {
  return active("an all-gather along mesh axis '" + axis + "'").axis_all_gather(x.contiguous(), dim, axis);
}

struct CopyToAxis : public torch::autograd::Function<CopyToAxis> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const std::string& axis) {
    ctx->saved_data["axis"] = axis;
    return x.view_as(x);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list g) {
    return {all_reduced(g[0], ctx->saved_data["axis"].toStringRef()), at::Tensor()};
  }
};

struct ReduceFromAxis : public torch::autograd::Function<ReduceFromAxis> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const std::string& axis) {
    return all_reduced(x, axis);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list g) { return {g[0], at::Tensor()}; }
};

struct GatherFromAxis : public torch::autograd::Function<GatherFromAxis> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t dim, const std::string& axis) {
    ctx->saved_data["axis"] = axis;
    ctx->saved_data["dim"] = dim;
    return all_gathered(x, dim, axis);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list g) {
    return {own_part(g[0], ctx->saved_data["dim"].toInt(), ctx->saved_data["axis"].toStringRef()).contiguous(),
            at::Tensor(), at::Tensor()};
  }
};

struct ScatterToAxis : public torch::autograd::Function<ScatterToAxis> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t dim, const std::string& axis) {
    ctx->saved_data["axis"] = axis;
    ctx->saved_data["dim"] = dim;
    return own_part(x, dim, axis).contiguous();
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list g) {
    return {all_gathered(g[0], ctx->saved_data["dim"].toInt(), ctx->saved_data["axis"].toStringRef()), at::Tensor(),
            at::Tensor()};
  }
};

// The one mesh axis a variable is sharded on and the dimension it shards
// ({"", -1} when replicated). ValueError for more than one sharded dimension.
std::pair<std::string, int64_t> sharded_axis(const Variable& v) {
  std::pair<std::string, int64_t> out{"", -1};
  const auto& axes = v.layout().axes;
  for (size_t i = 0; i < axes.size(); ++i) {
    if (axes[i].empty()) continue;
    if (!out.first.empty())
      throw ValueError("variable '" + v.path() + "' is sharded on two mesh axes ('" + out.first + "' and '" + axes[i] +
                       "'); kiln's layers run a kernel sharded on one dimension: shard one and replicate the other");
    out = {axes[i], static_cast<int64_t>(i)};
  }
  return out;
}

// Einsum operands as letters (Dense: "...i,io->...o"); an ellipsis may only
// lead, so positions count from the end.
struct Letters {
  std::string in, kernel, out;
};

Letters letters_of(const KernelSpec& spec, const std::string& what) {
  if (spec.equation.empty()) return {"i", "io", "o"};
  const std::string& eq = spec.equation;
  const auto comma = eq.find(','), arrow = eq.find("->");
  if (comma == std::string::npos || arrow == std::string::npos)
    throw ValueError(what + ": cannot shard the einsum '" + eq + "'");
  Letters l{eq.substr(0, comma), eq.substr(comma + 1, arrow - comma - 1), eq.substr(arrow + 2)};
  for (std::string* s : {&l.in, &l.out}) {
    if (s->rfind("...", 0) == 0) s->erase(0, 3);
    if (s->find('.') != std::string::npos)
      throw ValueError(what + ": a sharded kernel needs the einsum's ellipsis first (\"...b,bc->...c\"). Received '" +
                       eq + "'");
  }
  return l;
}

// Index counted from the end of `spec` for `c`, or 0 when absent.
int64_t from_end(const std::string& spec, char c) {
  const auto p = spec.find(c);
  return p == std::string::npos ? 0 : static_cast<int64_t>(p) - static_cast<int64_t>(spec.size());
}

class ShardedKernelImpl : public KernelImpl, public ShardedKernel {
 public:
  ShardedKernelImpl(KernelImplPtr inner, const KernelSpec& spec, const VariablePtr& kernel, const VariablePtr& bias,
                    const std::string& layer_path)
      : inner_(std::move(inner)) {
    const std::string what = "layer '" + layer_path + "'";
    auto [axis, kdim] = sharded_axis(*kernel);
    axis_ = axis;
    const Letters l = letters_of(spec, what);
    const char c = l.kernel.at(static_cast<size_t>(kdim));
    const bool in_out = l.out.find(c) != std::string::npos, in_in = l.in.find(c) != std::string::npos;
    full_ = kernel->global_shape().at(static_cast<size_t>(kdim));
    if (in_out && !in_in) {
      column_ = true;
      output_dim_ = from_end(l.out, c);
    } else if (in_in && !in_out) {
      input_dim_ = from_end(l.in, c);
    } else {
      throw ValueError(what + ": its kernel '" + kernel->path() + "' is sharded on a dimension ('" + c +
                       "') that the einsum '" + spec.equation +
                       "' neither only contracts nor only outputs; shard another kernel dimension");
    }
    if (bias) {
      auto [baxis, bdim] = sharded_axis(*bias);
      if (!baxis.empty() && baxis != axis_)
        throw ValueError(what + ": its bias is sharded on mesh axis '" + baxis + "' but its kernel on '" + axis_ + "'");
      bias_sharded_ = !baxis.empty();
      // The bias covers the output's last dimensions. A row-parallel
      // layer's output is whole, so its bias must be replicated.
      const int64_t brank = static_cast<int64_t>(bias->global_shape().size());
      if (column_ && -output_dim_ <= brank) bias_dim_ = brank + output_dim_;
      if (bias_sharded_ && bdim != bias_dim_)
        throw ValueError(what + ": its bias '" + bias->path() +
                         "' is sharded on a dimension the kernel's sharding does not split; shard the bias like the "
                         "kernel's output dimension or replicate it");
    }
    if (column_)
      if (auto o = active(what).output_layout(layer_path)) {
        const auto& axes = o->axes;
        const int64_t pos = static_cast<int64_t>(axes.size()) + output_dim_;
        asked_ = pos >= 0 && axes[static_cast<size_t>(pos)] == axis_;
      }
  }

  std::string mode() const override { return inner_->mode(); }

  at::Tensor apply(const at::Tensor& x, const at::Tensor& kernel) const override {
    return apply_with_bias(x, kernel, at::Tensor(), false);
  }

  at::Tensor apply_with_bias(const at::Tensor& x, const at::Tensor& kernel, const at::Tensor& bias,
                             bool training) const override {
    if (column_) {
      at::Tensor y = inner_->apply(copy_to_axis(x, axis_), kernel);
      if (bias.defined()) y = y + local_bias(bias).to(y.scalar_type());
      return asked_ || planned_ ? y : gather_from_axis(y, output_dim_, axis_);
    }
    at::Tensor local = x;
    const int64_t have = x.dim() >= -input_dim_ ? x.size(input_dim_) : -1;
    const int64_t n = active("a row-parallel layer").mesh_axis_size(axis_);
    if (have == full_)
      local = scatter_to_axis(x, input_dim_, axis_);
    else if (have * n != full_)
      throw ShapeError("a row-parallel layer sharded over mesh axis '" + axis_ + "' expects its input's dimension " +
                       std::to_string(input_dim_) + " to be " + std::to_string(full_) + " (whole) or " +
                       std::to_string(full_ / n) + " (this rank's shard). Received " + std::to_string(have));
    at::Tensor y = reduce_from_axis(inner_->apply(local, kernel), axis_);
    return bias.defined() ? y + bias.to(y.scalar_type()) : y;  // replicated (a split one is refused above)
  }

  bool keeps_float_kernel() const override { return true; }

  Shape logical_input_shape(const Shape& s) const override {
    Shape out = s;
    const int64_t r = static_cast<int64_t>(s.size());
    if (!column_ && r >= -input_dim_ &&
        s[r + input_dim_] * active("a row-parallel layer").mesh_axis_size(axis_) == full_)
      out[r + input_dim_] = full_;
    return out;
  }

  // ShardedKernel
  const std::string& axis() const override { return axis_; }
  bool column_parallel() const override { return column_; }
  bool row_parallel() const override { return !column_; }
  void keep_output_sharded(bool keep) override { planned_ = keep; }
  int64_t output_dim() const override { return output_dim_; }
  int64_t input_dim() const override { return input_dim_; }
  int64_t full_size() const override { return full_; }

 private:
  // The bias terms of this rank's output columns. A replicated bias gets
  // its gradient summed over the axis (each rank sees part of the output).
  at::Tensor local_bias(const at::Tensor& bias) const {
    if (bias_sharded_) return bias;
    at::Tensor b = copy_to_axis(bias, axis_);
    return bias_dim_ >= 0 ? own_part(b, bias_dim_, axis_) : b;
  }

  KernelImplPtr inner_;
  std::string axis_;
  bool column_ = false, bias_sharded_ = false;
  bool asked_ = false;    // the layout map's "<layer>/output" keeps the shard
  bool planned_ = false;  // keep_output_sharded: the consumer is row-parallel
  int64_t output_dim_ = 0, input_dim_ = 0, full_ = 0, bias_dim_ = -1;
};

}  // namespace

at::Tensor copy_to_axis(const at::Tensor& x, const std::string& axis) { return CopyToAxis::apply(x, axis); }
at::Tensor reduce_from_axis(const at::Tensor& x, const std::string& axis) { return ReduceFromAxis::apply(x, axis); }
at::Tensor gather_from_axis(const at::Tensor& x, int64_t dim, const std::string& axis) {
  return GatherFromAxis::apply(x, dim, axis);
}
at::Tensor scatter_to_axis(const at::Tensor& x, int64_t dim, const std::string& axis) {
  return ScatterToAxis::apply(x, dim, axis);
}

KernelImplPtr shard_kernel_impl(KernelImplPtr inner, const KernelSpec& spec, const VariablePtr& kernel,
                                const VariablePtr& bias, const std::string& layer_path) {
  if (!kernel || !kernel->sharded()) {
    if (kernel && bias && bias->sharded())
      throw ValueError("layer '" + layer_path + "': its bias is sharded but its kernel is not; shard the kernel too");
    return inner;
  }
  if (inner->mode() != "float")
    throw ValueError("layer '" + layer_path + "': a sharded kernel cannot be quantized (" + inner->mode() +
                     "); ModelParallel runs float kernels (float32, bfloat16, float16 policies)");
  return std::make_unique<ShardedKernelImpl>(std::move(inner), spec, kernel, bias, layer_path);
}

ShardedKernel* sharded_kernel(KernelImpl* impl) { return dynamic_cast<ShardedKernel*>(impl); }

bool sharded_pair_fits(KernelImpl* producer, KernelImpl* consumer) {
  ShardedKernel* p = producer ? sharded_kernel(producer) : nullptr;
  ShardedKernel* c = consumer ? sharded_kernel(consumer) : nullptr;
  return p && c && p->column_parallel() && c->row_parallel() && p->axis() == c->axis() &&
         p->output_dim() == c->input_dim() && p->full_size() == c->full_size();
}

bool plan_sharded_pair(KernelImpl* producer, KernelImpl* consumer) {
  ShardedKernel* p = producer ? sharded_kernel(producer) : nullptr;
  if (!p) return false;
  const bool keep = sharded_pair_fits(producer, consumer);
  p->keep_output_sharded(keep);
  return keep;
}

namespace {
// The layer's own activation, when it has one ("" otherwise).
std::string activation_of(Layer& l) {
  const Json c = l.get_config();
  return c.contains("activation") && c["activation"].is_string() ? c["activation"].get<std::string>() : "";
}
bool elementwise_activation(Layer& l) {
  const std::string a = activation_of(l);
  return a != "softmax" && a != "log_softmax";
}
}  // namespace

bool passes_shards_through(Layer& l) {
  static const std::set<std::string> kinds = {"Dropout", "ReLU", "LeakyReLU", "ELU", "Activation"};
  return kinds.count(l.class_name()) && elementwise_activation(l);
}

bool may_keep_output_sharded(Layer& l) { return elementwise_activation(l); }

void plan_sharded_chain(const std::vector<std::shared_ptr<Layer>>& layers) {
  for (size_t i = 0; i < layers.size(); ++i) {
    KernelImpl* p = layers[i]->kernel_impl_ptr();
    if (!p || !sharded_kernel(p)) continue;
    size_t j = i + 1;
    while (j < layers.size() && passes_shards_through(*layers[j])) ++j;
    KernelImpl* c = j < layers.size() && may_keep_output_sharded(*layers[i]) ? layers[j]->kernel_impl_ptr() : nullptr;
    plan_sharded_pair(p, c);
  }
}

at::Tensor sharded_embedding_lookup(const VariablePtr& table, const at::Tensor& value, const at::Tensor& ids,
                                    const std::string& layer_path) {
  if (!table->sharded()) return at::embedding(value, ids);
  auto [axis, dim] = sharded_axis(*table);
  Distribution& d = active("layer '" + layer_path + "'");
  if (dim == 1) {  // by feature: each rank holds some columns of every row
    at::Tensor y = at::embedding(value, ids);
    auto o = d.output_layout(layer_path);
    const bool keep = o && !o->axes.empty() && o->axes.back() == axis;
    return keep ? y : gather_from_axis(y, -1, axis);
  }
  // By vocabulary: rows [lo, lo + rows) live here.
  const int64_t rows = value.size(0), lo = d.mesh_axis_index(axis) * rows;
  at::Tensor here = (ids >= lo).logical_and(ids < lo + rows);
  at::Tensor local = at::where(here, ids - lo, at::zeros_like(ids));
  at::Tensor y = at::embedding(value, local) * here.unsqueeze(-1).to(value.scalar_type());
  return reduce_from_axis(y, axis);
}

}  // namespace kiln
