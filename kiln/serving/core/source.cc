#include "kiln/serving/core/source.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>

namespace kiln::serving {
namespace {

enum class Found { kYes, kNo, kUnreadable };

// stat() of p: kNo when nothing is there (a version being renamed away, or
// not complete yet), kUnreadable with *error naming p and the cause.
Found stat_path(const std::string& p, struct stat* st, std::string* error) {
  if (::stat(p.c_str(), st) == 0) return Found::kYes;
  if (errno == ENOENT) return Found::kNo;
  std::string why = std::strerror(errno);
  if (errno == ELOOP) why += " (a symlink loop)";
  *error = "cannot read " + p + ": " + why + "; fix or remove it";
  return Found::kUnreadable;
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
    struct stat st;
    std::string error;
    Found f = stat_path(dir, &st, &error);
    if (f == Found::kYes && !S_ISDIR(st.st_mode)) continue;
    if (f == Found::kYes) f = stat_path(dir + "/model.json", &st, &error);
    if (f == Found::kNo) continue;
    if (f == Found::kUnreadable)
      out[v] = {dir, -1, error};
    else
      out[v] = {dir, (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec};
  }
  ::closedir(d);
  return out;
}

}  // namespace kiln::serving
