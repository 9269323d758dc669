// The safetensors format (https://github.com/huggingface/safetensors), which
// kiln uses for weights, optimizer state and checkpoints:
//   u64 little-endian N | N bytes of JSON header | raw little-endian data
// header: {"<name>": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]},
//          "__metadata__": {"key": "value"}}
// Offsets are relative to the data section. Chosen because it is simple,
// safe to parse (no code execution, bounds-checkable), mmap-friendly and read
// by many other runtimes.
//
// Writes are atomic (temp + fsync + rename). Reading validates everything
// (header size, JSON, dtypes, shapes vs byte ranges, ranges inside the file,
// no overlaps) and throws FormatError naming the file and the problem.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace kiln {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Serialises in the given order (names must be unique: ValueError).
std::string encode_safetensors(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata = {});
NamedTensors decode_safetensors(const std::string& bytes, const std::string& what,
                                std::map<std::string, std::string>* metadata = nullptr);

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});
NamedTensors load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata = nullptr);

}  // namespace kiln
