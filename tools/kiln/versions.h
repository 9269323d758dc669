// Model versions under a base directory (`<base>/<version>/`), as the
// trainer publishes them and the server watches them: versions are positive
// integers; other entries (temp dirs such as ".3.tmp-x", "latest", "1a") are
// ignored.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kiln/models/model.h"

namespace kiln::cli {

// Versions present under `base`, ascending (empty if `base` does not exist).
std::vector<int64_t> list_versions(const std::string& base);

// max(list_versions(base)) + 1, or 1.
int64_t next_version(const std::string& base);

// Saves `model` (Model::save: atomic) as the next free version under `base`
// and returns its path. Concurrent publishers never overwrite each other: the
// model is written to a hidden staging directory, then renamed to the first
// free version; the rename fails if another process published it first, and
// the next number is tried.
std::string publish_next_version(models::Model& model, const std::string& base, bool include_optimizer = true);
// The same for any writer of a model directory (an Ensemble's save_to):
// `write(dir)` fills the staging directory `dir`.
std::string publish_next_version(const std::function<void(const std::string& dir)>& write, const std::string& base);

}  // namespace kiln::cli
