// The keys the Adam family shares (internal to kiln/optimizers).
#pragma once

#include "kiln/optimizers/optimizer_options.h"

namespace kiln::optimizers {

// beta_1 and beta_2 (each in [0, 1)) and epsilon (>= 0) of an Options struct.
template <class O>
config::FieldTable<O> beta_fields() {
  return {config::field("beta_1", &O::beta_1).in_range(0, 1, false),
          config::field("beta_2", &O::beta_2).in_range(0, 1, false), non_negative("epsilon", &O::epsilon)};
}

}  // namespace kiln::optimizers
