// The file-system source (TF Serving's FileSystemStoragePathSource): which
// complete versions of a model lie under its base path. ServerCore's poll
// thread asks it on every scan; it keeps no state.
//
//   for (auto& [version, v] : scan_versions("/models/mnist")) load(v.dir);
//
// A version is a directory under base whose name is a positive integer (at
// most 18 digits) holding model.json. Anything else (".tmp-3",
// "3.partial", a file) is ignored, so a version copied in under another
// name and renamed into place appears whole. A missing or unreadable base
// path has no versions. A version name whose directory or model.json cannot
// be examined (a symlink loop, no permission) is listed with `error` set,
// so that the server reports it instead of skipping it in silence.
// Thread safety: pure functions of the file system.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace kiln::serving {

struct VersionDir {
  std::string dir;                // base + "/" + name
  int64_t model_json_mtime = -1;  // ns; tells a version rewritten in place from the one loaded
  std::string error;              // why dir cannot be read ("... a symlink loop ..."); empty when it can
};

std::map<int64_t, VersionDir> scan_versions(const std::string& base_path);

// Modification time of a file in nanoseconds; -1 when it does not exist.
int64_t file_mtime_ns(const std::string& path);

}  // namespace kiln::serving
