#include "kiln/saving/safetensors.h"

#include <cstring>
#include <set>

#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/core/json.h"
#include "kiln/core/json_limits.h"

namespace kiln {
namespace {

struct DTypeCode {
  at::ScalarType type;
  const char* code;
};
constexpr DTypeCode kCodes[] = {
    {at::kDouble, "F64"}, {at::kFloat, "F32"}, {at::kHalf, "F16"}, {at::kBFloat16, "BF16"}, {at::kLong, "I64"},
    {at::kInt, "I32"},    {at::kShort, "I16"}, {at::kChar, "I8"},  {at::kByte, "U8"},       {at::kBool, "BOOL"},
};

const char* code_of(at::ScalarType t) {
  for (auto& c : kCodes)
    if (c.type == t) return c.code;
  throw ValueError(std::string("safetensors cannot store dtype ") + c10::toString(t));
}

bool type_of(const std::string& code, at::ScalarType* out) {
  for (auto& c : kCodes)
    if (code == c.code) {
      *out = c.type;
      return true;
    }
  return false;
}

constexpr uint64_t kMaxHeader = 100ull << 20;  // 100 MB, as the reference implementation limits

}  // namespace

std::string encode_safetensors(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) {
    Json m = Json::object();
    for (auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = m;
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  std::vector<at::Tensor> contig;
  for (auto& [name, t] : tensors) {
    if (name == "__metadata__" || !names.insert(name).second)
      throw ValueError("safetensors: duplicate or reserved tensor name '" + name + "'");
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    uint64_t bytes = (uint64_t)c.numel() * c.element_size();
    Json shape = Json::array();
    for (auto d : c.sizes()) shape.push_back(d);
    header[name] =
        Json{{"dtype", code_of(c.scalar_type())}, {"shape", shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    contig.push_back(c);
  }
  std::string h = header.dump();
  // Pad the header with spaces so the data section starts 8-byte aligned.
  while ((8 + h.size()) % 8) h.push_back(' ');
  std::string out;
  out.reserve(8 + h.size() + offset);
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out.push_back((char)((n >> (8 * i)) & 0xff));
  out += h;
  for (auto& c : contig) out.append((const char*)c.data_ptr(), (size_t)c.numel() * c.element_size());
  return out;
}

NamedTensors decode_safetensors(const std::string& bytes, const std::string& what,
                                std::map<std::string, std::string>* metadata) {
  auto bad = [&](const std::string& why) { return FormatError(what + " is not a valid safetensors file: " + why); };
  if (bytes.size() < 8) throw bad("it is " + std::to_string(bytes.size()) + " bytes long (truncated?)");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= (uint64_t)(unsigned char)bytes[i] << (8 * i);
  if (n > kMaxHeader || n > bytes.size() - 8)
    throw bad("header length " + std::to_string(n) + " exceeds the file size " + std::to_string(bytes.size()) +
              " (truncated?)");
  Json header;
  if (json_depth(std::string_view(bytes.data() + 8, n)) > kMaxJsonDepth)
    throw bad("the header nests JSON more than " + std::to_string(kMaxJsonDepth) + " levels deep");
  try {
    header = Json::parse(bytes.begin() + 8, bytes.begin() + 8 + (std::ptrdiff_t)n);
  } catch (const std::exception& e) {
    throw bad("header is not JSON");
  }
  if (!header.is_object()) throw bad("header is not a JSON object");
  const uint64_t data_size = bytes.size() - 8 - n;
  const char* data = bytes.data() + 8 + n;
  struct Entry {
    std::string name;
    at::ScalarType type;
    std::vector<int64_t> shape;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (metadata && it->is_object())
        for (auto m = it->begin(); m != it->end(); ++m)
          if (m->is_string()) (*metadata)[m.key()] = m->get<std::string>();
      continue;
    }
    const Json& e = *it;
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
      throw bad("entry '" + it.key() + "' lacks dtype, shape or data_offsets");
    Entry en;
    en.name = it.key();
    if (!e["dtype"].is_string() || !type_of(e["dtype"].get<std::string>(), &en.type))
      throw bad("entry '" + it.key() + "' has unsupported dtype " + json_excerpt(e["dtype"]) +
                "; kiln reads F64, F32, F16, BF16, I64, I32, I16, I8, U8 and BOOL");
    uint64_t numel = 1;
    if (!e["shape"].is_array()) throw bad("entry '" + it.key() + "' has a bad shape");
    for (auto& d : e["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) throw bad("entry '" + it.key() + "' has a bad shape");
      if (__builtin_mul_overflow(numel, (uint64_t)d.get<int64_t>(), &numel))
        throw bad("entry '" + it.key() + "' has a shape too large to hold");
      en.shape.push_back(d.get<int64_t>());
    }
    uint64_t nbytes = 0;
    if (__builtin_mul_overflow(numel, (uint64_t)c10::elementSize(en.type), &nbytes))
      throw bad("entry '" + it.key() + "' has a shape too large to hold");
    const Json& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      throw bad("entry '" + it.key() + "' has bad data_offsets");
    en.begin = off[0].get<uint64_t>();
    en.end = off[1].get<uint64_t>();
    if (en.end < en.begin || en.end > data_size)
      throw bad("entry '" + it.key() + "' points past the end of the data (truncated?)");
    if (en.end - en.begin != nbytes)
      throw bad("entry '" + it.key() + "' byte range does not match its shape and dtype");
    entries.push_back(en);
  }
  // Ranges must not overlap.
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto& e : entries) ranges.emplace_back(e.begin, e.end);
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second) throw bad("tensor byte ranges overlap");
  // The order they were written in (the model's weight order), not the
  // header's (alphabetical).
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  NamedTensors out;
  for (auto& e : entries) {
    at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.type));
    if (e.end > e.begin) std::memcpy(t.data_ptr(), data + e.begin, e.end - e.begin);
    out.emplace_back(e.name, t);
  }
  return out;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  atomic_write_file(path, encode_safetensors(tensors, metadata));
}

NamedTensors load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata) {
  return decode_safetensors(read_file(path), path, metadata);
}

}  // namespace kiln
