#include "kiln/training/csv_logger.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <sys/stat.h>
#include <unistd.h>

#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/models/model.h"
#include "kiln/training/path_format.h"
#include "kiln/training/train_state.h"

namespace kiln {
namespace {

int64_t file_size(std::FILE* f) {
  struct stat st {};
  return ::fstat(::fileno(f), &st) == 0 ? (int64_t)st.st_size : 0;
}

}  // namespace

callbacks::CSVLoggerImpl::CSVLoggerImpl(callbacks::CSVLoggerOptions o)
    : filename_(std::move(o.filename)), sep_(std::move(o.separator)), append_(o.append) {
  if (filename_.empty()) throw ValueError("CSVLogger: `filename` must not be empty");
  if (sep_.empty()) throw ValueError("CSVLogger: `separator` must not be empty");
}

callbacks::CSVLoggerImpl::~CSVLoggerImpl() { close(); }

void callbacks::CSVLoggerImpl::close() {
  if (file_) std::fclose(file_);
  file_ = nullptr;
}

void callbacks::CSVLoggerImpl::on_train_begin(const Logs&) {
  close();
  if (!is_chief()) return;  // data parallel: the chief alone writes (file_ stays closed)
  keys_.clear();
  write_header_ = true;
  // A resumed run (BackupAndRestore restored a checkpoint; it runs first)
  // keeps the file: set_state() cuts it back to the checkpoint's length.
  const bool resuming = has_model() && model().compiled() && model().train_state().progress().resume.has_value();
  const bool keep = append_ || resuming;
  if (keep && path_exists(filename_)) {
    std::string text = read_file(filename_);
    write_header_ = text.empty();
    if (!text.empty()) {
      // Reuse the existing header's columns so appended rows line up.
      std::string header = text.substr(0, text.find('\n'));
      size_t pos = 0;
      std::vector<std::string> cols;
      while (true) {
        size_t next = header.find(sep_, pos);
        cols.push_back(header.substr(pos, next == std::string::npos ? std::string::npos : next - pos));
        if (next == std::string::npos) break;
        pos = next + sep_.size();
      }
      if (!cols.empty() && cols[0] == "epoch") keys_.assign(cols.begin() + 1, cols.end());
    }
  }
  make_dirs(parent_path(filename_));
  file_ = std::fopen(filename_.c_str(), keep ? "a" : "w");
  if (!file_) throw IOError("CSVLogger: cannot open " + filename_ + ": " + std::strerror(errno));
  bytes_ = file_size(file_);
}

Json callbacks::CSVLoggerImpl::get_state() const {
  return Json{{"keys", keys_}, {"write_header", write_header_}, {"bytes", bytes_}};
}

void callbacks::CSVLoggerImpl::set_state(const Json& s) {
  keys_ = s.at("keys").get<std::vector<std::string>>();
  write_header_ = s.at("write_header").get<bool>();
  const int64_t bytes = s.at("bytes").get<int64_t>();
  if (!file_) return;
  std::fflush(file_);
  const int64_t now = file_size(file_);
  if (now < bytes) {
    warn("CSVLogger: " + filename_ + " is shorter (" + std::to_string(now) + " bytes) than at the checkpoint (" +
         std::to_string(bytes) + "); appending to it as it is");
    bytes_ = now;
    return;
  }
  // Rows written after the checkpoint belong to epochs that run again.
  if (::ftruncate(::fileno(file_), (off_t)bytes) != 0)
    throw IOError("CSVLogger: cannot truncate " + filename_ + ": " + std::strerror(errno));
  bytes_ = bytes;
}

void callbacks::CSVLoggerImpl::on_epoch_end(int epoch, Logs& logs) {
  if (!file_) return;
  if (keys_.empty()) {
    for (auto& [k, v] : logs) keys_.push_back(k);  // std::map: sorted
    bool has_val =
        std::any_of(keys_.begin(), keys_.end(), [](const std::string& k) { return k.rfind("val_", 0) == 0; });
    if (!has_val && params().value("do_validation", false)) {
      auto base = keys_;
      for (auto& k : base) keys_.push_back("val_" + k);
    }
  }
  std::string line;
  if (write_header_) {
    line = "epoch";
    for (auto& k : keys_) line += sep_ + k;
    line += "\n";
    write_header_ = false;
  }
  line += std::to_string(epoch);
  for (auto& k : keys_) {
    auto it = logs.find(k);
    line += sep_ + (it == logs.end() ? std::string("NA") : python_float_repr(it->second));
  }
  line += "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0)
    throw IOError("CSVLogger: cannot write " + filename_ + ": " + std::strerror(errno));
  bytes_ = file_size(file_);
}

void callbacks::CSVLoggerImpl::on_train_end(const Logs&) { close(); }

}  // namespace kiln
