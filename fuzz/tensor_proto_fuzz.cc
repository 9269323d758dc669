// Fuzzes TensorProto decoding (kiln/serving/codec/tensor_proto.cc), the gRPC
// Predict input: dtype, shape, tensor_content and the typed repeated fields
// (including TF's one-value broadcast), and KServe v2's InferInputTensor with
// and without raw_input_contents. A decoded tensor must encode back to a
// proto that decodes to the same tensor.
#include <cstdlib>
#include <cstring>

#include "fuzz/fuzz_util.h"
#include "kiln/serving/codec/tensor_proto.h"

// protobuf logs every string field with invalid UTF-8 it parses; the fuzzer
// makes millions.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool kserve = data[0] & 1;
  const std::string bytes = kiln::fuzz::as_string(data + 1, size - 1);
  if (!kserve) {
    tensorflow::TensorProto proto;
    if (!proto.ParseFromString(bytes)) return 0;
    kiln::fuzz::expect_kiln_errors_only([&] {
      kiln::serving::WireTensor t = kiln::serving::from_tensor_proto(proto, "fuzz input");
      if (!t.tensor.defined()) return;
      tensorflow::TensorProto again;
      kiln::serving::to_tensor_proto(t.tensor, &again);
      kiln::serving::WireTensor u = kiln::serving::from_tensor_proto(again, "re-encoded");
      if (!u.tensor.defined() || u.tensor.scalar_type() != t.tensor.scalar_type() ||
          u.tensor.sizes() != t.tensor.sizes())
        abort();
      at::Tensor a = t.tensor.contiguous(), b = u.tensor.contiguous();
      // Bytes, not values: NaN payloads must survive too.
      if (a.numel() > 0 && std::memcmp(a.data_ptr(), b.data_ptr(), a.numel() * a.element_size()) != 0) abort();
    });
  } else {
    inference::ModelInferRequest request;
    if (!request.ParseFromString(bytes)) return 0;
    for (int i = 0; i < request.inputs_size(); ++i) {
      const std::string* raw = i < request.raw_input_contents_size() ? &request.raw_input_contents(i) : nullptr;
      kiln::fuzz::expect_kiln_errors_only([&] { kiln::serving::from_infer_input(request.inputs(i), raw); });
    }
  }
  return 0;
}
