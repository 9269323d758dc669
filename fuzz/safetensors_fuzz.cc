// Fuzzes the safetensors reader (kiln/saving/safetensors.cc): the 8-byte
// header length, the JSON header (dtypes, shapes, data offsets, metadata) and
// the bounds of every tensor's bytes. What decodes must encode and decode
// again to the same names, dtypes, shapes and bytes.
#include <torch/torch.h>

#include <cstdlib>
#include <cstring>

#include "fuzz/fuzz_util.h"
#include "kiln/saving/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kiln::fuzz::expect_kiln_errors_only([&] {
    std::map<std::string, std::string> metadata;
    kiln::NamedTensors tensors = kiln::decode_safetensors(kiln::fuzz::as_string(data, size), "fuzz input", &metadata);
    kiln::NamedTensors again = kiln::decode_safetensors(kiln::encode_safetensors(tensors, metadata), "re-encoded");
    if (again.size() != tensors.size()) abort();
    for (size_t i = 0; i < tensors.size(); ++i) {
      const at::Tensor& a = tensors[i].second;
      const at::Tensor& b = again[i].second;
      if (again[i].first != tensors[i].first || a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) abort();
      // Bytes, not values: NaN payloads must survive too.
      if (a.numel() > 0 && std::memcmp(a.data_ptr(), b.data_ptr(), a.numel() * a.element_size()) != 0) abort();
    }
  });
  return 0;
}
