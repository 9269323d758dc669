// The conformance harness every layer passes (docs/DESIGN.md, "One
// conformance harness for every layer"; after Keras's run_layer_test). A
// new layer is one call:
//
//   TEST(Dense, Conformance) {
//     LayerTestCase c;
//     c.name = "Dense(3)";
//     c.make = from_config("Dense", {{"units", 3}});
//     c.input_shapes = {{2, 4}};
//     c.expected_output_shapes = {{2, 3}};
//     c.expected_trainable_params = 15;
//     run_layer_test(c);
//   }
//
// run_layer_test checks, with gtest assertions (each failure names the case
// and the check):
//   1. shapes: the eager output shapes and dtypes (float32 policy); the
//      shapes from compute_output_shape with an unknown batch; and those of
//      a symbolic call on keras Input()s.
//   2. parameter counts: trainable / non-trainable as expected, every
//      variable path under the layer's name, and set_trainable(false)
//      freezing every weight (and true restoring them).
//   3. config round trip: to_json -> text -> layer_from_json gives the same
//      class, get_config and to_json, and, after set_weights(get_weights()),
//      exactly the same outputs.
//   4. save/load: the weights written to a file keyed by variable path and
//      read into a freshly initialised copy give bit-identical outputs.
//   5. gradients: the layer rebuilt with a float64 policy; autograd's
//      gradients of sum(output * R) for the floating inputs and every
//      trainable weight against central finite differences on a sample of
//      coordinates.
//   6. one training step: SGD on an MSE to a random target (training=true,
//      same RNG seed before each forward so dropout masks repeat) lowers the
//      loss, and every trainable weight receives a finite gradient.
//      Skipped automatically when the layer has no trainable weights.
//   7. mixed precision: under "mixed_bfloat16" floating outputs are
//      bfloat16, every floating variable stays float32, outputs match the
//      float32 layer's (same weights) within `mixed_tolerance`, and
//      gradients reaching the variables are float32.
// A check is skipped by giving a reason in the matching skip_* field; the
// reason is printed so skipped checks stay visible.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "kiln/layers/layer.h"

namespace kiln {

struct LayerTestCase {
  std::string name;                          // shown in every failure
  std::function<LayerPtr()> make;            // a fresh, unbuilt layer (float32 policy)
  std::vector<Shape> input_shapes;           // concrete, batch axis first
  std::vector<at::ScalarType> input_dtypes;  // default: float32 for every input
  int64_t int_input_high = 10;               // integer inputs are drawn from [0, high)
  // String inputs (dtype kStringDType; input_shapes are their logical
  // shapes) take values drawn from here (kiln/core/string_tensor.h).
  std::vector<std::string> string_pool;
  std::vector<Shape> expected_output_shapes;  // concrete, batch axis first
  int64_t expected_trainable_params = 0;
  int64_t expected_non_trainable_params = 0;

  // Non-empty: skip that check, for this reason.
  std::string skip_input_gradients;
  std::string skip_weight_gradients;
  std::string skip_training;
  std::string skip_mixed_precision;

  // Finite differences (float64): coordinates sampled per tensor, tolerance
  // |numeric - autograd| <= grad_atol + grad_rtol * |autograd|.
  int grad_samples = 6;
  double grad_atol = 1e-6;
  double grad_rtol = 1e-5;
  // |bf16 - f32| <= mixed_tolerance * (1 + max |f32 output|).
  double mixed_tolerance = 0.05;
  uint64_t seed = 1234;
};

// gtest prints a case by its name (test listings, ctest names).
void PrintTo(const LayerTestCase& c, std::ostream* os);

// A factory for `make`: LayerRegistry::create(class_name, config).
std::function<LayerPtr()> from_config(const std::string& class_name, const Json& config);

void run_layer_test(const LayerTestCase& c);

// The inputs run_layer_test feeds (seeded by c.seed).
Tensors make_test_inputs(const LayerTestCase& c);

// Weights keyed by variable path, written with atomic_write_file. A simple
// interim format (later: the project's safetensors writer); these two
// functions are the only code that knows it.
void save_layer_weights(const Layer& layer, const std::string& path);
// Every weight of `layer` must be in the file with the same shape and dtype
// (FormatError / NotFoundError / ShapeError otherwise).
void load_layer_weights(Layer& layer, const std::string& path);

}  // namespace kiln
