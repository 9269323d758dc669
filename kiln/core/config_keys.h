// The one check for config keys: a key an object does not know is an error
// that names the key, where it was found and the keys allowed there, so a
// typo never passes silently (docs/SPEC.md, "Strict keys").
//
//   check_config_keys(cfg, {"units", "activation"}, "Dense 'dense_1' config");
//   // ValueError: unknown key `unitz` in Dense 'dense_1' config; allowed keys: units, activation
#pragma once

#include <string>
#include <vector>

#include "kiln/core/json.h"

namespace kiln {

// ValueError if `j` is not an object or has a key outside `allowed`.
void check_config_keys(const Json& j, const std::vector<std::string>& allowed, const std::string& where);

}  // namespace kiln
