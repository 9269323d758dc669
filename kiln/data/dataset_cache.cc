// cache(): in memory, or in a file of kiln's own format.
//
// File layout (little-endian):
//   header (40 bytes): magic "KILNDSC1" | u32 version = 1 | u32 flags = 0 |
//                      u64 num_elements | u64 body_bytes | u32 crc32(body) |
//                      u32 crc32(the 36 header bytes before it)
//   body, per element: u32 num_tensors, then per tensor:
//                      u8 dtype code | u8 ndim | i64 dims[ndim] |
//                      u64 nbytes | nbytes of C-order data
// The file appears only complete (atomic_write_file at the end of the first
// full pass); the sizes and CRCs catch truncation and bit rot anyway, because
// a file can be copied, edited or come from another program.
#include <ATen/ATen.h>
#include <zlib.h>

#include <cstring>
#include <mutex>

#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/data/dataset_node.h"

namespace kiln {
namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'D', 'S', 'C', '1'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 40;
constexpr int kMaxDims = 64;

struct DtypeCode {
  uint8_t code;
  at::ScalarType type;
};
constexpr DtypeCode kDtypes[] = {
    {1, at::kFloat}, {2, at::kDouble}, {3, at::kHalf}, {4, at::kBFloat16}, {5, at::kByte},
    {6, at::kChar},  {7, at::kShort},  {8, at::kInt},  {9, at::kLong},     {10, at::kBool},
};

uint8_t dtype_code(at::ScalarType t) {
  for (const auto& d : kDtypes) {
    if (d.type == t) return d.code;
  }
  throw ValueError(std::string("Dataset.cache: cannot write tensors of dtype ") + c10::toString(t) +
                   " to a cache file; supported: float32/64, float16, bfloat16, (u)int8, int16/32/64, bool");
}

uint32_t crc32_of(const char* p, size_t n) {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (n > 0) {
    const uInt chunk = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(p), chunk);
    p += chunk;
    n -= chunk;
  }
  return static_cast<uint32_t>(crc);
}

template <class T>
void put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof v);
}

void append_element(std::string* out, const Element& e) {
  put<uint32_t>(out, static_cast<uint32_t>(e.size()));
  for (const auto& t0 : e) {
    const at::Tensor t = t0.to(at::kCPU).contiguous();
    put<uint8_t>(out, dtype_code(t.scalar_type()));
    put<uint8_t>(out, static_cast<uint8_t>(t.dim()));
    for (int64_t d = 0; d < t.dim(); ++d) put<int64_t>(out, t.size(d));
    const uint64_t nbytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    put<uint64_t>(out, nbytes);
    out->append(static_cast<const char*>(t.data_ptr()), nbytes);
  }
}

// A parsed, CRC-checked cache file; elements are decoded on demand.
class CacheFile {
 public:
  explicit CacheFile(std::string path) : path_(std::move(path)), data_(read_file(path_)) {
    if (data_.size() < kHeaderBytes)
      fail("truncated: " + std::to_string(data_.size()) + " bytes, shorter than the header");
    if (std::memcmp(data_.data(), kMagic, sizeof kMagic) != 0) fail("bad magic (not a kiln dataset cache file)");
    const uint32_t version = get<uint32_t>(8);
    if (version != kVersion) fail("unsupported version " + std::to_string(version));
    num_elements_ = get<uint64_t>(16);
    const uint64_t body_bytes = get<uint64_t>(24);
    const uint32_t body_crc = get<uint32_t>(32);
    const uint32_t header_crc = get<uint32_t>(36);
    if (crc32_of(data_.data(), 36) != header_crc) fail("header checksum mismatch");
    if (body_bytes != data_.size() - kHeaderBytes) {
      fail("length mismatch: the header promises " + std::to_string(body_bytes) + " bytes of data, the file has " +
           std::to_string(data_.size() - kHeaderBytes) +
           (body_bytes > data_.size() - kHeaderBytes ? " (truncated)" : ""));
    }
    if (crc32_of(data_.data() + kHeaderBytes, body_bytes) != body_crc) fail("data checksum mismatch (corrupt)");
  }

  uint64_t num_elements() const { return num_elements_; }
  size_t size() const { return data_.size(); }

  // Decodes the element at byte `*offset`, advancing it.
  Element read_element(size_t* offset) const {
    const uint32_t n = get<uint32_t>(*offset);
    *offset += 4;
    Element e;
    e.reserve(n);
    for (uint32_t i = 0; i < n; ++i) {
      const uint8_t code = get<uint8_t>(*offset);
      const uint8_t ndim = get<uint8_t>(*offset + 1);
      *offset += 2;
      at::ScalarType type = at::kFloat;
      bool found = false;
      for (const auto& d : kDtypes) {
        if (d.code == code) {
          type = d.type;
          found = true;
        }
      }
      if (!found) fail("unknown dtype code " + std::to_string(code) + " at byte " + std::to_string(*offset - 2));
      if (ndim > kMaxDims) fail("implausible rank " + std::to_string(ndim));
      std::vector<int64_t> dims(ndim);
      uint64_t numel = 1;
      for (uint8_t d = 0; d < ndim; ++d) {
        dims[d] = get<int64_t>(*offset);
        *offset += 8;
        if (dims[d] < 0) fail("negative dimension at byte " + std::to_string(*offset - 8));
        numel *= static_cast<uint64_t>(dims[d]);
      }
      const uint64_t nbytes = get<uint64_t>(*offset);
      *offset += 8;
      at::Tensor t = at::empty(dims, at::TensorOptions().dtype(type));
      if (nbytes != numel * t.element_size()) {
        fail("tensor size mismatch at byte " + std::to_string(*offset - 8) + ": " + std::to_string(nbytes) +
             " bytes for shape " + shape_string(t));
      }
      if (nbytes > data_.size() - *offset) fail("tensor data runs past the end of the file");
      if (nbytes) std::memcpy(t.data_ptr(), data_.data() + *offset, nbytes);
      *offset += nbytes;
      e.push_back(std::move(t));
    }
    return e;
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw FormatError("Dataset.cache: cache file " + path_ + " is invalid: " + what +
                      ". Delete it to rebuild the cache.");
  }

 private:
  template <class T>
  T get(size_t offset) const {
    if (offset > data_.size() || data_.size() - offset < sizeof(T))
      fail("unexpected end of file at byte " + std::to_string(offset));
    T v;
    std::memcpy(&v, data_.data() + offset, sizeof v);
    return v;
  }

  std::string path_;
  std::string data_;
  uint64_t num_elements_ = 0;
};

class CacheFileIterator : public data::DatasetIterator {
 public:
  explicit CacheFileIterator(std::string path) : file_(std::move(path)) {}
  std::optional<Element> next() override {
    if (index_ >= file_.num_elements()) {
      if (offset_ != file_.size()) file_.fail("extra bytes after the last element");
      return std::nullopt;
    }
    ++index_;
    return file_.read_element(&offset_);
  }

 private:
  CacheFile file_;
  uint64_t index_ = 0;
  size_t offset_ = kHeaderBytes;
};

// First pass to a file: serialises elements as they go by and writes the file
// atomically when the input ends. Destroyed earlier, it writes nothing.
class CacheFileWriter : public data::DatasetIterator {
 public:
  CacheFileWriter(std::unique_ptr<data::DatasetIterator> in, std::string path)
      : in_(std::move(in)), path_(std::move(path)), buffer_(kHeaderBytes, '\0') {}
  std::optional<Element> next() override {
    if (done_) return std::nullopt;
    auto e = in_->next();
    if (e) {
      append_element(&buffer_, *e);
      ++count_;
      return e;
    }
    done_ = true;
    finish();
    return std::nullopt;
  }

 private:
  void finish() {
    std::memcpy(&buffer_[0], kMagic, sizeof kMagic);
    auto set = [&](size_t off, auto v) { std::memcpy(&buffer_[off], &v, sizeof v); };
    set(8, kVersion);
    set(12, uint32_t{0});
    set(16, count_);
    set(24, static_cast<uint64_t>(buffer_.size() - kHeaderBytes));
    set(32, crc32_of(buffer_.data() + kHeaderBytes, buffer_.size() - kHeaderBytes));
    set(36, crc32_of(buffer_.data(), 36));
    make_dirs(parent_path(path_));
    atomic_write_file(path_, buffer_);
    std::string().swap(buffer_);
  }

  std::unique_ptr<data::DatasetIterator> in_;
  std::string path_;
  std::string buffer_;
  uint64_t count_ = 0;
  bool done_ = false;
};

using Elements = std::vector<Element>;

class MemoryIterator : public data::DatasetIterator {
 public:
  explicit MemoryIterator(std::shared_ptr<const Elements> elements) : elements_(std::move(elements)) {}
  std::optional<Element> next() override {
    if (i_ >= elements_->size()) return std::nullopt;
    return (*elements_)[i_++];
  }
  int64_t skip_batches(int64_t n) override {
    const int64_t k = std::min<int64_t>(n, static_cast<int64_t>(elements_->size() - i_));
    i_ += k;
    return k;
  }

 private:
  std::shared_ptr<const Elements> elements_;
  size_t i_ = 0;
};

class CacheNode;

// First pass in memory: keeps the elements and publishes them to the node
// when the input ends.
class MemoryWriter : public data::DatasetIterator {
 public:
  MemoryWriter(std::shared_ptr<const CacheNode> node, std::unique_ptr<data::DatasetIterator> in,
               std::optional<at::Device> device)
      : node_(std::move(node)), in_(std::move(in)), device_(device), elements_(std::make_shared<Elements>()) {}
  std::optional<Element> next() override;

 private:
  std::shared_ptr<const CacheNode> node_;
  std::unique_ptr<data::DatasetIterator> in_;
  std::optional<at::Device> device_;  // keep the elements there
  std::shared_ptr<Elements> elements_;
  bool done_ = false;
};

class CacheNode : public DatasetNode {
 public:
  CacheNode(NodePtr input, std::string filename, std::optional<at::Device> device)
      : input_(std::move(input)), filename_(std::move(filename)), device_(device) {}
  std::unique_ptr<data::DatasetIterator> make_iterator(uint64_t key) const override {
    if (!filename_.empty()) {
      if (path_exists(filename_)) return std::make_unique<CacheFileIterator>(filename_);
      return std::make_unique<CacheFileWriter>(input_->make_iterator(key), filename_);
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      if (memory_) return std::make_unique<MemoryIterator>(memory_);
    }
    return std::make_unique<MemoryWriter>(self<CacheNode>(), input_->make_iterator(key), device_);
  }
  int64_t cardinality() const override { return input_->cardinality(); }

  void publish(std::shared_ptr<const Elements> elements) const {
    std::lock_guard<std::mutex> l(mu_);
    if (!memory_) memory_ = std::move(elements);
  }

 private:
  NodePtr input_;
  std::string filename_;
  std::optional<at::Device> device_;
  mutable std::mutex mu_;
  mutable std::shared_ptr<const Elements> memory_;  // guarded by mu_; set once
};

std::optional<Element> MemoryWriter::next() {
  if (done_) return std::nullopt;
  auto e = in_->next();
  if (e) {
    if (device_)
      for (auto& t : *e)
        if (t.defined() && t.device() != *device_) t = t.to(*device_);
    elements_->push_back(*e);
    return e;
  }
  done_ = true;
  node_->publish(std::move(elements_));
  return std::nullopt;
}

}  // namespace

NodePtr make_cache_node(NodePtr input, std::string filename, std::optional<at::Device> device) {
  return std::make_shared<CacheNode>(std::move(input), std::move(filename), device);
}

}  // namespace kiln
