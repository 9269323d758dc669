// A Distribution that runs fit() its own way. Model::fit() hands the whole
// call to the active distribution when it is also a FitRunner, after
// checking its arguments; parameter-server training
// (kiln/ps/ps_strategy.h) is one: its chief coordinates, its workers take
// steps and its ps tasks serve variables, none of which is fit()'s loop.
//
//   class MyStrategy : public Distribution, public FitRunner {
//     History run_fit(Model& model, const FitArgs& args) override;
//   };
//
// Thread safety: as fit().
#pragma once

#include "kiln/models/fit_args.h"

namespace kiln {

namespace models {
class Model;
}

class FitRunner {
 public:
  virtual ~FitRunner();
  // fit(args) for `model` (compiled; args checked as fit() checks them).
  virtual History run_fit(models::Model& model, const FitArgs& args) = 0;
};

// --- what fit() and a FitRunner share (defined with fit(), trainer.cc) ---

// Builds the model (creating its variables) with a one-row probe of
// `sample` when it is not built yet (or always, with `force_probe`);
// returns its number of outputs (0 when nothing ran).
size_t build_with_probe(models::Model& model, const Tensors& sample, bool force_probe);

// Keras's validation_split: the last `fraction` of the rows, taken before
// shuffling. ValueError when either part would be empty.
struct ValidationSplit {
  Tensors x, y, val_x, val_y;
  at::Tensor sample_weight, val_sample_weight;  // undefined when none was given
};
ValidationSplit split_validation(const Tensors& x, const Tensors& y, const at::Tensor& sample_weight, double fraction);

// The callbacks' params ({"verbose", "epochs", "steps", "do_validation"}).
Json fit_params_json(int verbose, int epochs, int64_t steps, bool do_validation);

}  // namespace kiln
