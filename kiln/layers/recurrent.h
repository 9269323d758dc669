// Recurrent layers with Keras 3's semantics, config keys and weight layout:
// LSTM, GRU, SimpleRNN, and the wrappers Bidirectional and TimeDistributed.
//
//   auto lstm = std::make_shared<LSTM>(LSTMOptions{.units = 32, .return_sequences = true});
//   at::Tensor y = (*lstm)(at::randn({8, 20, 16}));       // (8, 20, 32)
//   auto bi = std::make_shared<Bidirectional>(Json{{"layer", lstm->to_json()}});
//
// Inputs: (batch, time, features); extra inputs, if any, are the initial
// states (LSTM: h, c; GRU/SimpleRNN: h), zeros otherwise. Outputs: the last
// output (batch, units), or every output (batch, time, units) with
// return_sequences; return_state appends the final states.
//
// Weights (Keras's names and layout, under "<layer>/<kind>_cell/"):
//   kernel (features, g*units), recurrent_kernel (units, g*units), bias
//   with g = 4 gates i,f,c,o for LSTM, 3 gates z,r,h for GRU, 1 for
//   SimpleRNN. GRU with reset_after (Keras 3's default) has bias (2, 3*units):
//   row 0 the input bias, row 1 the recurrent bias (PyTorch's GRU form);
//   reset_after=false a bias (3*units) and the reset gate applied before the
//   recurrent product (the original GRU).
//
// Config keys (Keras 3's names and defaults): units (required), activation
// ("tanh"), recurrent_activation ("sigmoid"; not SimpleRNN), use_bias (true),
// kernel_initializer ("glorot_uniform"), recurrent_initializer
// ("orthogonal"), bias_initializer ("zeros"), unit_forget_bias (LSTM, true:
// the forget gate's bias starts at 1), reset_after (GRU, true),
// kernel/recurrent/bias/activity_regularizer (null), the three constraints
// (null only), dropout and recurrent_dropout (0: rates in [0, 1) on the
// inputs and on the recurrent state, one mask per call shared by every step
// and gate, as Keras 3's cells; training calls only), seed (null or an int;
// dropout draws from kiln's global generator), return_sequences,
// return_state, go_backwards (false; outputs come in the processed, i.e.
// reversed, order as in Keras), stateful (false only: kiln keeps no state
// between calls), unroll (accepted; no effect), use_cudnn (accepted; no
// effect), zero_output_for_mask (false).
//
// Masking (layer.h): with a (batch, time) mask, a masked step keeps the
// previous state and repeats the previous output (zeros with
// zero_output_for_mask), so a padded, masked sequence gives the outputs and
// final state of the unpadded one. The output mask is the input mask with
// return_sequences, none otherwise.
//
// Thread safety: as Layer (inference calls may run concurrently).
#pragma once

#include <optional>

#include "kiln/layers/activations.h"
#include "kiln/layers/layer.h"
#include "kiln/layers/layer_holder.h"
#include "kiln/layers/layer_options.h"
#include "kiln/layers/regularizers.h"

namespace kiln {

namespace layers {

// LSTM, GRU and SimpleRNN options (Keras 3's names and defaults; see above).
struct RecurrentOptions {
  int64_t units = 0;  // required, > 0
  std::string activation = "tanh";
  std::string recurrent_activation = "sigmoid";  // LSTM and GRU only
  bool use_bias = true;
  InitializerArg kernel_initializer = "glorot_uniform";
  InitializerArg recurrent_initializer = "orthogonal";
  InitializerArg bias_initializer = "zeros";
  bool unit_forget_bias = true;                                                                      // LSTM only
  bool reset_after = true;                                                                           // GRU only
  RegularizerPtr kernel_regularizer, recurrent_regularizer, bias_regularizer, activity_regularizer;  // null: none
  double dropout = 0.0;                                                                              // in [0, 1)
  double recurrent_dropout = 0.0;                                                                    // in [0, 1)
  std::optional<int64_t> seed;
  bool return_sequences = false;
  bool return_state = false;
  bool go_backwards = false;
  bool unroll = false;            // accepted; no effect
  std::optional<bool> use_cudnn;  // unset: "auto"; accepted, no effect
  bool zero_output_for_mask = false;
  LayerOptions base;
};

}  // namespace layers
using LSTMOptions = layers::RecurrentOptions;
using GRUOptions = layers::RecurrentOptions;
using SimpleRNNOptions = layers::RecurrentOptions;

namespace layers {

// What LSTM, GRU and SimpleRNN share: config, weights, the time loop and
// masking. Subclasses give the gate count, the state count and one step.
class RecurrentLayer : public Layer {
 public:
  void build(const std::vector<Shape>& input_shapes) override;
  Tensors call(const Tensors& inputs, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  bool supports_masking() const override { return true; }
  Tensors compute_mask(const Tensors& inputs, const Tensors& masks) override;
  Json get_config() const override;

  int64_t units() const { return options_.units; }
  bool return_sequences() const { return options_.return_sequences; }
  bool return_state() const { return options_.return_state; }
  bool go_backwards() const { return options_.go_backwards; }
  // 2 for LSTM (h, c), 1 otherwise.
  virtual int num_states() const { return 1; }
  const VariablePtr& kernel() const { return kernel_; }
  const VariablePtr& recurrent_kernel() const { return recurrent_kernel_; }
  const VariablePtr& bias() const { return bias_; }  // null when use_bias=false

 protected:
  // `kind` names the cell ("lstm" -> variables under "lstm_cell/").
  // `own_keys`: the subclass's extra config keys (it reads them itself).
  // ValueError when `options` sets a key this class does not have
  // (recurrent_activation for SimpleRNN, unit_forget_bias outside LSTM,
  // reset_after outside GRU).
  RecurrentLayer(const RecurrentOptions& options, const Json& base_config, const std::string& owner,
                 const std::string& kind, int gates, bool has_recurrent_activation);
  // The config's keys as options; ValueError for an unknown key or a bad value.
  static RecurrentOptions options_from_config(const Json& config, const std::string& owner, const std::string& kind,
                                              bool has_recurrent_activation);
  Tensors call_masked(const Tensors& inputs, const Tensors& masks, bool training, Tensors* output_masks) override;
  // The bias variable's shape and initial value (LSTM's unit_forget_bias,
  // GRU's two rows).
  virtual Shape bias_shape() const;
  virtual InitializerPtr bias_build_initializer() const { return options_.bias_initializer.resolved(); }
  // One time step: `xw` = x_t @ kernel (+ input bias), (batch, gates*units);
  // `states` the previous states (states[0] = h); `h_rec` the h that meets
  // the recurrent kernel (h, or h with recurrent dropout). Returns the new
  // states; the step's output is the new states[0].
  virtual Tensors step(const at::Tensor& xw, const Tensors& states, const at::Tensor& h_rec,
                       const at::Tensor& recurrent_kernel, const at::Tensor& recurrent_bias) = 0;
  // The part of the bias added to x @ kernel (all of it except GRU
  // reset_after's recurrent row), and the recurrent part (or undefined).
  virtual at::Tensor input_bias(const at::Tensor& bias) const { return bias; }
  virtual at::Tensor recurrent_bias(const at::Tensor& bias) const { return at::Tensor(); }

  RecurrentOptions options_;  // checked: the layer's config
  int gates_;
  ActivationFn activation_, recurrent_activation_;

 private:
  std::string kind_;
  bool has_recurrent_activation_;
  VariablePtr kernel_, recurrent_kernel_, bias_;
};

// Keras's LSTM: i = σ(x Wi + h Ui + bi), f, o alike, c~ = tanh(x Wc + h Uc +
// bc), c' = f c + i c~, h' = o tanh(c') (σ = recurrent_activation, tanh =
// activation). Matches torch.nn.LSTM with weight_ih = kernel^T, weight_hh =
// recurrent_kernel^T (same gate order), bias_ih = bias, bias_hh = 0.
class LSTMImpl : public RecurrentLayer {
 public:
  explicit LSTMImpl(const RecurrentOptions& options);
  explicit LSTMImpl(const Json& config);
  std::string class_name() const override { return "LSTM"; }
  int num_states() const override { return 2; }

 protected:
  Tensors step(const at::Tensor& xw, const Tensors& states, const at::Tensor& h_rec, const at::Tensor& u,
               const at::Tensor& rb) override;
  InitializerPtr bias_build_initializer() const override;

 private:
  LSTMImpl(const RecurrentOptions& options, const Json& base_config);
};
KILN_LAYER_HOLDER(LSTM, RecurrentOptions);

// Keras's GRU (gates z, r, h): z = σ(x Wz + bz + h Uz + rbz), r alike,
// h~ = tanh(x Wh + bh + r (h Uh + rbh)) with reset_after (Keras 3 and
// torch.nn.GRU; torch's gate order is r, z, n), or tanh(x Wh + bh + (r h) Uh)
// without; h' = z h + (1 - z) h~.
class GRUImpl : public RecurrentLayer {
 public:
  explicit GRUImpl(const RecurrentOptions& options);
  explicit GRUImpl(const Json& config);
  std::string class_name() const override { return "GRU"; }
  bool reset_after() const { return options_.reset_after; }

 protected:
  Tensors step(const at::Tensor& xw, const Tensors& states, const at::Tensor& h_rec, const at::Tensor& u,
               const at::Tensor& rb) override;
  Shape bias_shape() const override;
  at::Tensor input_bias(const at::Tensor& bias) const override;
  at::Tensor recurrent_bias(const at::Tensor& bias) const override;

 private:
  GRUImpl(const RecurrentOptions& options, const Json& base_config);
};
KILN_LAYER_HOLDER(GRU, RecurrentOptions);

// Keras's SimpleRNN: h' = activation(x W + b + h U) (torch.nn.RNN with
// bias_hh = 0).
class SimpleRNNImpl : public RecurrentLayer {
 public:
  explicit SimpleRNNImpl(const RecurrentOptions& options);
  explicit SimpleRNNImpl(const Json& config);
  std::string class_name() const override { return "SimpleRNN"; }

 protected:
  Tensors step(const at::Tensor& xw, const Tensors& states, const at::Tensor& h_rec, const at::Tensor& u,
               const at::Tensor& rb) override;

 private:
  SimpleRNNImpl(const RecurrentOptions& options, const Json& base_config);
};
KILN_LAYER_HOLDER(SimpleRNN, RecurrentOptions);

// Keras's Bidirectional: runs a copy of `layer` forwards ("forward_<name>")
// and one backwards ("backward_<name>", go_backwards flipped, or the given
// backward_layer), reverses the backward outputs to the forward time order
// when return_sequences, and merges: merge_mode "concat" (default, last
// axis), "sum", "mul", "ave", or null (two outputs). return_state appends
// the forward layer's states, then the backward layer's. Masks reach both
// directions. Keys: layer (required, {"class_name", "config"} of a recurrent
// layer), merge_mode, backward_layer (optional, same form).
class BidirectionalImpl : public Layer {
 public:
  explicit BidirectionalImpl(const Json& config);
  std::string class_name() const override { return "Bidirectional"; }
  void build(const std::vector<Shape>& input_shapes) override;
  Tensors call(const Tensors& inputs, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  bool supports_masking() const override { return true; }
  Tensors compute_mask(const Tensors& inputs, const Tensors& masks) override;
  Json get_config() const override;

  const std::shared_ptr<RecurrentLayer>& forward_layer() const { return forward_; }
  const std::shared_ptr<RecurrentLayer>& backward_layer() const { return backward_; }

 protected:
  Tensors call_masked(const Tensors& inputs, const Tensors& masks, bool training, Tensors* output_masks) override;

 private:
  std::string merge_mode_;  // "" for null
  std::shared_ptr<RecurrentLayer> forward_, backward_;
};
KILN_LAYER_HOLDER(Bidirectional, void);

// Keras's TimeDistributed: applies `layer` to every step of (batch, time,
// ...) by folding time into the batch; the layer's weights are shared
// across steps. The input mask passes through. Keys: layer (required).
class TimeDistributedImpl : public Layer {
 public:
  explicit TimeDistributedImpl(const Json& config);
  std::string class_name() const override { return "TimeDistributed"; }
  void build(const std::vector<Shape>& input_shapes) override;
  Tensors call(const Tensors& inputs, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  bool supports_masking() const override { return true; }
  Json get_config() const override;
  const LayerPtr& layer() const { return layer_; }

 private:
  LayerPtr layer_;
};
KILN_LAYER_HOLDER(TimeDistributed, void);

}  // namespace layers

}  // namespace kiln

#define KILN_LEGACY_LAYERS_RECURRENT_H
#include "kiln/layers/legacy_names.h"
