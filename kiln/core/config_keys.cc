#include "kiln/core/config_keys.h"

#include <algorithm>

#include "kiln/core/error.h"

namespace kiln {

void check_config_keys(const Json& j, const std::vector<std::string>& allowed, const std::string& where) {
  if (!j.is_object()) {
    std::string s = j.dump();
    if (s.size() > 200) s = s.substr(0, 200) + "...";
    throw ValueError(where + " must be a JSON object. Received: " + s);
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (std::find(allowed.begin(), allowed.end(), it.key()) != allowed.end()) continue;
    std::string known;
    for (auto& k : allowed) known += (known.empty() ? "" : ", ") + k;
    std::string key = it.key().size() > 100 ? it.key().substr(0, 100) + "..." : it.key();
    throw ValueError("unknown key `" + key + "` in " + where + "; allowed keys: " + known);
  }
}

}  // namespace kiln
