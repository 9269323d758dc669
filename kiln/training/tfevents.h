// TensorBoard event files ("tfevents"), written without TensorFlow.
//
// A file is a sequence of TFRecords:
//   uint64 length (little-endian) | uint32 masked_crc32c(length bytes)
//   | data[length] | uint32 masked_crc32c(data)
// where masked_crc32c(x) = ((c >> 15) | (c << 17)) + 0xa282ead8 with c the
// CRC-32C (Castagnoli) of x. Each record's data is a tensorflow.Event
// protobuf (proto/tensorflow/core/util/event.proto, TensorFlow's field
// numbers), serialized by libprotobuf's generated code: file_version
// "brain.Event:2" in the first record, then Summary values (tag,
// simple_value). The framing and its CRC are written here.
//
//   EventFileWriter w("logs/train");          // creates the directory
//   w.add_scalar("epoch_loss", 0.51f, 0);     // step 0
//   w.flush();
//
// Thread safety: one writer per thread.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace kiln {

uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
uint32_t masked_crc32c(const void* data, size_t n);

// Seconds since the Unix epoch: an Event's wall_time.
double unix_seconds();

// A TFRecord around `data`.
std::string tfrecord_frame(const std::string& data);

// Serialized tensorflow.Event messages (the header stays protobuf-free).
std::string encode_file_version_event(double wall_time, const std::string& version = "brain.Event:2");
std::string encode_scalar_event(double wall_time, int64_t step, const std::string& tag, float value);

class EventFileWriter {
 public:
  // Creates `log_dir` and a new file
  // "events.out.tfevents.<unix seconds>.<hostname>.<pid>.<n>.v2" whose first
  // record carries file_version "brain.Event:2". IOError on failure.
  explicit EventFileWriter(const std::string& log_dir);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  void add_scalar(const std::string& tag, double value, int64_t step);
  // Appends one serialized tensorflow.Event (e.g. a plugin summary).
  void add_event(const std::string& serialized_event) { write_record(serialized_event); }
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace kiln
