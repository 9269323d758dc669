#include "kiln/core/io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>

#include "kiln/core/error.h"

namespace fs = std::filesystem;

namespace kiln {
namespace {

std::string errno_text() { return std::strerror(errno); }

// "<host>-<pid>-<8 hex digits>": temporary names carry their owner, so a
// later run can tell a killed writer's leftovers from a live writer's
// (kiln/saving/model_io.cc's remove_stale_staging parses this; keep the
// two in step).
std::string random_suffix() {
  static thread_local std::mt19937_64 rng(std::random_device{}() ^ (uint64_t)::getpid() << 32);
  const char* hex = "0123456789abcdef";
  std::string s(8, '0');
  for (auto& c : s) c = hex[rng() & 15];
  char host[256] = {0};
  std::string h;
  if (::gethostname(host, sizeof host - 1) == 0)
    for (const char* p = host; *p && h.size() < 32; ++p)
      if (std::isalnum((unsigned char)*p)) h += *p;
  if (h.empty()) h = "host";
  return h + "-" + std::to_string(::getpid()) + "-" + s;
}

// What a non-regular, non-directory file is, for the error that refuses it.
std::string file_kind(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a file";
}

}  // namespace

std::string read_file(const std::string& path) {
  // O_NONBLOCK: opening a FIFO without a writer would otherwise wait for one
  // forever (and a server loading it could not shut down); the fstat below
  // refuses it instead. Reads of a regular file ignore the flag.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) throw NotFoundError("file not found: " + path);
    throw IOError("cannot open " + path + ": " + errno_text());
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    std::string err = errno_text();
    ::close(fd);
    throw IOError("cannot stat " + path + ": " + err);
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    throw NotFoundError(path + " is a directory, expected a file");
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw FormatError(path + " is not a regular file (" + file_kind(st.st_mode) +
                      "); kiln reads only regular files: replace it with one");
  }
  std::string out;
  out.reserve(st.st_size > 0 ? (size_t)st.st_size : 4096);
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      throw IOError("cannot read " + path + ": " + errno_text());
    }
    if (n == 0) break;
    out.append(buf, (size_t)n);
  }
  ::close(fd);
  return out;
}

bool path_exists(const std::string& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}

bool is_directory(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec);
}

void make_dirs(const std::string& path) {
  if (path.empty()) return;
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec && !fs::is_directory(path)) throw IOError("cannot create directory " + path + ": " + ec.message());
}

void remove_all(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
}

void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

std::string join_path(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (a.back() == '/') return a + b;
  return a + "/" + b;
}

std::string parent_path(const std::string& path) {
  auto p = fs::path(path).parent_path().string();
  return p.empty() ? "." : p;
}

void atomic_write_file(const std::string& path, const std::string& data) {
  const std::string dir = parent_path(path);
  const std::string tmp = join_path(dir, "." + fs::path(path).filename().string() + ".tmp-" + random_suffix());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw IOError("cannot create " + tmp + ": " + errno_text());
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      std::string err = errno_text();
      ::close(fd);
      ::unlink(tmp.c_str());
      throw IOError("cannot write " + path + ": " + err);
    }
    off += (size_t)n;
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    std::string err = errno_text();
    ::unlink(tmp.c_str());
    throw IOError("cannot flush " + path + ": " + err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string err = errno_text();
    ::unlink(tmp.c_str());
    throw IOError("cannot rename " + tmp + " to " + path + ": " + err);
  }
  fsync_path(dir);
}

AtomicDirectory::AtomicDirectory(std::string target) : target_(std::move(target)) {
  while (!target_.empty() && target_.back() == '/') target_.pop_back();
  const std::string dir = parent_path(target_);
  make_dirs(dir);
  tmp_ = join_path(dir, "." + fs::path(target_).filename().string() + ".tmp-" + random_suffix());
  make_dirs(tmp_);
}

AtomicDirectory::~AtomicDirectory() {
  if (!committed_) remove_all(tmp_);
}

void AtomicDirectory::commit(bool replace) {
  if (committed_) return;
  // Make every file inside durable before the rename publishes the directory.
  std::error_code ec;
  for (auto& e : fs::recursive_directory_iterator(tmp_, ec)) fsync_path(e.path().string());
  fsync_path(tmp_);
  std::string old;
  if (path_exists(target_)) {
    if (!replace) throw IOError("cannot publish " + target_ + ": it already exists");
    old = target_ + ".old-" + random_suffix();
    if (::rename(target_.c_str(), old.c_str()) != 0)
      throw IOError("cannot move aside " + target_ + ": " + errno_text());
  }
  if (::rename(tmp_.c_str(), target_.c_str()) != 0) {
    std::string err = errno_text();
    if (!old.empty()) ::rename(old.c_str(), target_.c_str());
    throw IOError("cannot publish " + target_ + ": " + err);
  }
  committed_ = true;
  fsync_path(parent_path(target_));
  if (!old.empty()) remove_all(old);
}

std::vector<std::string> list_directory(const std::string& path) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(path, ec)) out.push_back(e.path().filename().string());
  if (ec) throw NotFoundError("cannot list directory " + path + ": " + ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace kiln
