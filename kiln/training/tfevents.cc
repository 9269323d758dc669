#include "kiln/training/tfevents.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "tensorflow/core/util/event.pb.h"

namespace kiln {
namespace {

struct Crc32cTable {
  uint32_t t[256];
  Crc32cTable() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // reflected Castagnoli
      t[i] = c;
    }
  }
};

// TFRecord framing: little-endian fixed-width integers.
void put_fixed64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_fixed32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::string hostname() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof buf - 1) != 0 || !buf[0]) return "localhost";
  return buf;
}

}  // namespace

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  static const Crc32cTable table;
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table.t[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tfrecord_frame(const std::string& data) {
  std::string out;
  std::string len;
  put_fixed64(len, data.size());
  out += len;
  put_fixed32(out, masked_crc32c(len.data(), len.size()));
  out += data;
  put_fixed32(out, masked_crc32c(data.data(), data.size()));
  return out;
}

std::string encode_file_version_event(double wall_time, const std::string& version) {
  tensorflow::Event ev;
  ev.set_wall_time(wall_time);
  ev.set_file_version(version);
  return ev.SerializeAsString();
}

std::string encode_scalar_event(double wall_time, int64_t step, const std::string& tag, float value) {
  tensorflow::Event ev;
  ev.set_wall_time(wall_time);
  ev.set_step(step);
  auto* v = ev.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(value);
  return ev.SerializeAsString();
}

EventFileWriter::EventFileWriter(const std::string& log_dir) {
  static std::atomic<int> counter{0};
  make_dirs(log_dir);
  const double now = unix_seconds();
  char stamp[32];
  std::snprintf(stamp, sizeof stamp, "%010lld", (long long)now);
  path_ = join_path(log_dir, std::string("events.out.tfevents.") + stamp + "." + hostname() + "." +
                                 std::to_string(::getpid()) + "." + std::to_string(counter++) + ".v2");
  file_ = std::fopen(path_.c_str(), "wb");
  if (!file_) throw IOError("TensorBoard: cannot create " + path_ + ": " + std::strerror(errno));
  write_record(encode_file_version_event(now));
  flush();
}

EventFileWriter::~EventFileWriter() {
  if (file_) std::fclose(file_);
}

void EventFileWriter::write_record(const std::string& data) {
  std::string rec = tfrecord_frame(data);
  if (std::fwrite(rec.data(), 1, rec.size(), file_) != rec.size())
    throw IOError("TensorBoard: cannot write " + path_ + ": " + std::strerror(errno));
}

void EventFileWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  write_record(encode_scalar_event(unix_seconds(), step, tag, static_cast<float>(value)));
}

void EventFileWriter::flush() {
  if (file_ && std::fflush(file_) != 0)
    throw IOError("TensorBoard: cannot flush " + path_ + ": " + std::strerror(errno));
}

}  // namespace kiln
