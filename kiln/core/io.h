// Crash-safe file I/O. Nothing kiln writes is ever seen half-written: files
// are written to a temporary name in the same directory, fsync'd, renamed over
// the target, and the directory is fsync'd. Directories (a model version, a
// checkpoint) are assembled under a temporary name and renamed into place
// only when complete.
//
// Thread safety: the functions are thread-safe for distinct targets.
#pragma once

#include <string>
#include <vector>

namespace kiln {

// Whole file as bytes. NotFoundError naming the path if it does not exist
// (or is a directory), FormatError if it is not a regular file (a FIFO, a
// device, a socket: refused at once, never waited on), IOError if it cannot
// be read.
std::string read_file(const std::string& path);

bool path_exists(const std::string& path);
bool is_directory(const std::string& path);

// mkdir -p. IOError naming the path on failure.
void make_dirs(const std::string& path);

// rm -rf; missing paths are fine.
void remove_all(const std::string& path);

// Writes `data` to `path` atomically (temp + fsync + rename + fsync(dir)).
void atomic_write_file(const std::string& path, const std::string& data);

// fsync a file or directory by path (best effort on directories).
void fsync_path(const std::string& path);

// Builds a directory atomically:
//   AtomicDirectory d("models/mnist/3");
//   atomic_write_file(d.path() + "/model.json", ...);
//   d.commit();   // renames "models/mnist/.3.tmp-XXXX" to "models/mnist/3"
// If commit() is not called (exception, crash) the temporary directory is
// removed (or, after a crash, left under a dot-name that loaders ignore).
// commit(replace=true) swaps out an existing target (old one removed after).
class AtomicDirectory {
 public:
  explicit AtomicDirectory(std::string target);
  ~AtomicDirectory();
  AtomicDirectory(const AtomicDirectory&) = delete;
  AtomicDirectory& operator=(const AtomicDirectory&) = delete;

  const std::string& path() const { return tmp_; }  // where to write now
  const std::string& target() const { return target_; }
  void commit(bool replace = true);

 private:
  std::string target_;
  std::string tmp_;
  bool committed_ = false;
};

// Directory entries (names only, no "." or ".."), sorted.
std::vector<std::string> list_directory(const std::string& path);

std::string join_path(const std::string& a, const std::string& b);
std::string parent_path(const std::string& path);

}  // namespace kiln
