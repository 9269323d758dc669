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

class Model;

class FitRunner {
 public:
  virtual ~FitRunner();
  // fit(args) for `model` (compiled; args checked as fit() checks them).
  virtual History run_fit(Model& model, const FitArgs& args) = 0;
};

}  // namespace kiln
