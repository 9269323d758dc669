#include "tools/kiln/versions.h"

#include <errno.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/saving/model_io.h"

namespace kiln::cli {
namespace {

// "12" -> 12; anything but a plain positive decimal integer -> 0.
int64_t parse_version(const std::string& name) {
  if (name.empty() || name.size() > 18 || name[0] == '0') return 0;
  if (!std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; })) return 0;
  return std::stoll(name);
}

}  // namespace

std::vector<int64_t> list_versions(const std::string& base) {
  std::vector<int64_t> out;
  if (!is_directory(base)) return out;
  for (auto& name : list_directory(base)) {
    int64_t v = parse_version(name);
    if (v > 0 && is_directory(join_path(base, name))) out.push_back(v);
  }
  std::sort(out.begin(), out.end());
  return out;
}

int64_t next_version(const std::string& base) {
  auto v = list_versions(base);
  return v.empty() ? 1 : v.back() + 1;
}

std::string publish_next_version(models::Model& model, const std::string& base, bool include_optimizer) {
  return publish_next_version([&](const std::string& dir) { model.save(dir, include_optimizer); }, base);
}

std::string publish_next_version(const std::function<void(const std::string& dir)>& write, const std::string& base) {
  if (path_exists(base) && !is_directory(base))
    throw ValueError("the output base " + base + " exists and is not a directory; choose another --output");
  make_dirs(base);
  // Owned by this process by name, so a later run removes it if this one
  // is killed before the rename (remove_stale_staging).
  const std::string staging = staging_path(base, "staging");
  write(staging);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const std::string target = join_path(base, std::to_string(next_version(base)));
    // rename() onto a non-empty directory fails: a version published by
    // another process in between is never replaced.
    if (::rename(staging.c_str(), target.c_str()) == 0) {
      fsync_path(base);
      return target;
    }
    if (errno != ENOTEMPTY && errno != EEXIST) {
      std::string err = std::strerror(errno);
      remove_all(staging);
      throw IOError("cannot publish " + target + ": " + err);
    }
  }
  remove_all(staging);
  throw IOError("cannot find a free version under " + base);
}

}  // namespace kiln::cli
