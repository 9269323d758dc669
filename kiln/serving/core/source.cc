#include "kiln/serving/core/source.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>

namespace kiln::serving {
namespace {

bool is_dir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

int64_t file_mtime_ns(const std::string& p) {
  struct stat st;
  if (::stat(p.c_str(), &st) != 0) return -1;
  return (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
}

std::map<int64_t, VersionDir> scan_versions(const std::string& base) {
  std::map<int64_t, VersionDir> out;
  DIR* d = ::opendir(base.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n.empty() || n.size() > 18 ||
        !std::all_of(n.begin(), n.end(), [](char c) { return std::isdigit((unsigned char)c); }))
      continue;
    int64_t v = std::stoll(n);
    if (v < 1) continue;
    std::string dir = base + "/" + n;
    if (!is_dir(dir)) continue;
    int64_t mtime = file_mtime_ns(dir + "/model.json");
    if (mtime < 0) continue;
    out[v] = {dir, mtime};
  }
  ::closedir(d);
  return out;
}

}  // namespace kiln::serving
