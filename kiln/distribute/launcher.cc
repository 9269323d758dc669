// Placeholder: the launcher is being written (see launcher.h).
#include "kiln/distribute/launcher.h"

#include "kiln/core/error.h"

namespace kiln::distribute {

int launch(const LaunchOptions&) { throw Error("kiln launch: not built yet"); }

}  // namespace kiln::distribute
