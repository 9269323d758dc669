// Model-parallel kernels: how Dense, EinsumDense and Embedding compute when
// ModelParallel (kiln/distribute/model_parallel.h) shards their weights over
// a mesh axis, with the fewest collectives (Megatron-LM's scheme):
//
//   kernel sharded on     the layer runs       collectives (forward / backward)
//   an output axis        column-parallel      none / all-reduce of the input's gradient;
//                                              plus an all-gather of the output unless
//                                              the output stays sharded (below)
//   a contracted axis     row-parallel         all-reduce of the partial sums / none;
//                                              a full input is sliced to the rank's part
//
// A column-parallel layer keeps its output sharded when the layout map asks
// for it ("<layer path>/output" with the mesh axis on that output
// dimension) or when its consumer is a row-parallel layer on the same axis
// (keep_output_sharded: Sequential, Functional and MultiHeadAttention plan
// it), so a
// column-parallel layer followed by a row-parallel one (an MLP block, the
// attention heads) needs no gather in between. A row-parallel layer takes
// either input: its full width (sliced here) or its shard (used as it is).
//
// Embedding: sharded by vocabulary (rows) it looks up the ids it holds, zeros
// the others and all-reduces; sharded by feature it gathers the columns
// unless its output stays sharded.
//
// Layers hold no branch for this: Layer::build_kernel_impl wraps the
// kernel implementation when the kernel is sharded, and Embedding calls
// sharded_embedding_lookup whatever the layout.
//
// Thread safety: as KernelImpl; the collectives run on the calling thread
// and every rank must run the same layers in the same order.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "kiln/core/variable.h"
#include "kiln/layers/kernel_impl.h"

namespace kiln {

// Collectives along a mesh axis of the active distribution that autograd
// differentiates (identities without one).
// Forward identity; backward: the gradient summed over the axis.
at::Tensor copy_to_axis(const at::Tensor& x, const std::string& axis);
// Forward: summed over the axis; backward identity.
at::Tensor reduce_from_axis(const at::Tensor& x, const std::string& axis);
// Forward: the axis's shards concatenated along `dim`; backward: this rank's part.
at::Tensor gather_from_axis(const at::Tensor& x, int64_t dim, const std::string& axis);
// Forward: this rank's part along `dim`; backward: the parts gathered.
at::Tensor scatter_to_axis(const at::Tensor& x, int64_t dim, const std::string& axis);

// `inner` (a float kernel implementation) made model-parallel when the
// layer's `kernel` is sharded (returned unchanged otherwise). `bias` may be
// null; `layer_path` names the layer ("sequential/dense_1") for its output
// layout. ValueError for layouts kiln cannot compute (a kernel sharded on
// two axes, a quantized kernel, an einsum whose sharded letter appears in
// all three operands).
KernelImplPtr shard_kernel_impl(KernelImplPtr inner, const KernelSpec& spec, const VariablePtr& kernel,
                                const VariablePtr& bias, const std::string& layer_path);

// The model-parallel view of a layer's kernel implementation (null when the
// kernel is not sharded).
class ShardedKernel {
 public:
  virtual ~ShardedKernel() = default;
  virtual const std::string& axis() const = 0;
  // Kernel split on an output dimension (column) or a contracted one (row).
  virtual bool column_parallel() const = 0;
  virtual bool row_parallel() const = 0;
  // Column-parallel: whether the output keeps the split dimension (no
  // gather); set by the model's plan (the layout map's output key keeps it
  // split whatever this says).
  virtual void keep_output_sharded(bool keep) = 0;
  // Column-parallel: the output dimension it splits; row-parallel: the
  // input dimension it contracts (both negative, from the end); and that
  // dimension's whole size.
  virtual int64_t output_dim() const = 0;
  virtual int64_t input_dim() const = 0;
  virtual int64_t full_size() const = 0;
};
ShardedKernel* sharded_kernel(KernelImpl* impl);

// Whether `consumer` is row-parallel on the axis `producer` is
// column-parallel on and contracts exactly the dimension it splits (so the
// split output can feed it without a gather).
bool sharded_pair_fits(KernelImpl* producer, KernelImpl* consumer);
// Marks `producer`'s output as staying sharded when sharded_pair_fits, and
// clears the mark otherwise. Returns whether it kept it.
bool plan_sharded_pair(KernelImpl* producer, KernelImpl* consumer);

// Plans a chain of layers (Sequential's): each column-parallel layer whose
// next layer, past layers that act element-wise (Dropout, ReLU, Activation
// other than softmax), is row-parallel on the same axis keeps its output
// sharded. A no-op without sharded kernels.
class Layer;
void plan_sharded_chain(const std::vector<std::shared_ptr<Layer>>& layers);
// Whether a layer passes a split activation through unchanged in layout
// (one input, element-wise: Dropout, ReLU, LeakyReLU, ELU, Activation other
// than softmax).
bool passes_shards_through(Layer& layer);
// Whether `layer` (a column-parallel one) may leave its output split: its
// own activation must be element-wise.
bool may_keep_output_sharded(Layer& layer);

// Embedding's lookup of `ids` in `table` (the variable; `value` its value in
// the compute dtype), whatever the variable's layout.
at::Tensor sharded_embedding_lookup(const VariablePtr& table, const at::Tensor& value, const at::Tensor& ids,
                                    const std::string& layer_path);

}  // namespace kiln
