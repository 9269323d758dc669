#include "kiln/training/tfevents.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "kiln/core/error.h"
#include "kiln/core/io.h"

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

// --- a minimal protobuf writer ---
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_tag(std::string& out, uint32_t field, uint32_t wire_type) { put_varint(out, (field << 3) | wire_type); }
void put_fixed64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_fixed32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_double(std::string& out, uint32_t field, double d) {
  uint64_t bits;
  std::memcpy(&bits, &d, 8);
  put_tag(out, field, 1);
  put_fixed64(out, bits);
}
void put_float(std::string& out, uint32_t field, float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  put_tag(out, field, 5);
  put_fixed32(out, bits);
}
void put_bytes(std::string& out, uint32_t field, const std::string& bytes) {
  put_tag(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
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
  std::string ev;
  put_double(ev, 1, wall_time);
  put_bytes(ev, 3, version);
  return ev;
}

std::string encode_scalar_event(double wall_time, int64_t step, const std::string& tag, float value) {
  std::string v;  // Summary.Value
  put_bytes(v, 1, tag);
  put_float(v, 2, value);
  std::string summary;
  put_bytes(summary, 1, v);
  std::string ev;
  put_double(ev, 1, wall_time);
  put_tag(ev, 2, 0);
  put_varint(ev, static_cast<uint64_t>(step));
  put_bytes(ev, 5, summary);
  return ev;
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
