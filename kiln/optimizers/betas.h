// Shared argument checks of the Adam family (internal to kiln/optimizers).
#pragma once

#include <sstream>
#include <string>

#include "kiln/core/error.h"
#include "kiln/optimizers/optimizer_options.h"

namespace kiln::optimizers {

// ValueError naming the first of beta_1, beta_2 (each in [0, 1)) and epsilon
// (>= 0) that is out of range.
inline void check_betas(const std::string& owner, double beta_1, double beta_2, double epsilon) {
  std::ostringstream os;
  if (!(beta_1 >= 0.0 && beta_1 < 1.0))
    os << owner << ": `beta_1` must be in [0, 1). Received: beta_1=" << beta_1;
  else if (!(beta_2 >= 0.0 && beta_2 < 1.0))
    os << owner << ": `beta_2` must be in [0, 1). Received: beta_2=" << beta_2;
  else if (!(epsilon >= 0.0))
    os << owner << ": `epsilon` must be non-negative. Received: epsilon=" << epsilon;
  if (!os.str().empty()) throw ValueError(os.str());
}

// The config an Adam-family Options struct (learning_rate, beta_1, beta_2,
// epsilon, base) stands for; the class adds its own keys (Adam's amsgrad).
template <class Options>
Json beta_optimizer_config(const Options& o) {
  Json c = optimizer_config(o.base, o.learning_rate);
  c["beta_1"] = o.beta_1;
  c["beta_2"] = o.beta_2;
  c["epsilon"] = o.epsilon;
  return c;
}

}  // namespace kiln::optimizers
