#include "kiln/training/fit_runner.h"

namespace kiln {

FitRunner::~FitRunner() = default;  // the key function: one typeinfo for dynamic_cast across libraries

}  // namespace kiln
