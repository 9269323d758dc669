// Wire tensors <-> at::Tensor: TensorFlow's TensorProto (TF Serving gRPC) and
// KServe v2's InferInputTensor / InferOutputTensor (contents or raw bytes).
//
// Decoding accepts both TF encodings: raw little-endian bytes in
// `tensor_content`, or the typed field of the dtype (float_val, int_val,
// half_val, ...). As in TensorFlow, a single typed value fills the whole
// shape. Any other count, a tensor_content of the wrong length, a negative
// dimension or an unsupported dtype throws ValueError (the server maps it to
// INVALID_ARGUMENT) naming the tensor, the received count and the expected one.
//
// Strings (DT_STRING / KServe BYTES) have no at::Tensor dtype: they decode to
// WireTensor::strings (row-major) with WireTensor::shape.
//
// Supported dtypes: float, double, int32, int64, int16, int8, uint8, bool,
// half, bfloat16, string. The host is assumed little-endian (x86-64, arm64).
// Thread safety: pure functions.
//
//   tensorflow::TensorProto p;
//   to_tensor_proto(at::ones({2, 3}), &p);                 // float_val
//   WireTensor w = from_tensor_proto(p, "inputs['x']");    // w.tensor: (2, 3)
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "inference/grpc_predict_v2.pb.h"
#include "kiln/core/json.h"
#include "kiln/core/shape.h"
#include "tensorflow/core/framework/tensor.pb.h"

namespace kiln::serving {

struct WireTensor {
  at::Tensor tensor;                 // numeric tensors; undefined for strings
  std::vector<std::string> strings;  // string tensors, row-major
  Shape shape;                       // shape of either
  bool is_string() const { return !tensor.defined(); }
};

enum class TensorEncoding {
  kTypedValues,    // float_val, int_val, ... (TF Serving's default) / KServe contents
  kTensorContent,  // raw little-endian bytes (tensor_content / raw_*_contents)
};

// --- TensorFlow -------------------------------------------------------------
// ValueError for dtypes kiln cannot hold (DT_COMPLEX64, DT_UINT16, ...).
at::ScalarType to_scalar_type(tensorflow::DataType dtype, const std::string& what);
tensorflow::DataType to_data_type(at::ScalarType type);  // ValueError if none
std::string data_type_name(tensorflow::DataType dtype);  // "DT_FLOAT"

// `what` names the tensor in errors ("inputs['x']").
WireTensor from_tensor_proto(const tensorflow::TensorProto& proto, const std::string& what);
void to_tensor_proto(const at::Tensor& tensor, tensorflow::TensorProto* out,
                     TensorEncoding encoding = TensorEncoding::kTypedValues);
void to_tensor_proto(const Shape& shape, const std::vector<std::string>& strings, tensorflow::TensorProto* out);
void shape_to_proto(const Shape& shape, tensorflow::TensorShapeProto* out);

// --- KServe v2 --------------------------------------------------------------
std::string kserve_datatype(at::ScalarType type);  // "FP32", "INT64", ..., "BYTES" for kStringDType; ValueError if none
at::ScalarType from_kserve_datatype(const std::string& datatype, const std::string& what);  // not "BYTES"

// Decodes one input. `raw` is its raw_input_contents entry, or nullptr when
// the request carries typed `contents`; an input whose `contents` hold values
// while `raw` is given is refused (ValueError), as the protocol forbids both.
WireTensor from_infer_input(const inference::ModelInferRequest::InferInputTensor& input, const std::string* raw);
// Fills name/datatype/shape and either `contents` (raw == nullptr) or *raw.
void to_infer_output(const std::string& name, const at::Tensor& tensor,
                     inference::ModelInferResponse::InferOutputTensor* out, std::string* raw);
void to_infer_output(const std::string& name, const Shape& shape, const std::vector<std::string>& strings,
                     inference::ModelInferResponse::InferOutputTensor* out, std::string* raw);

// --- Signatures ---------------------------------------------------------------
// The tensor a signature input takes from `w`: for an input of dtype
// "string" its strings as a string tensor (strings::encode, shape w.shape),
// for any other input the numeric tensor as it came. `spec` is the input's
// signature entry ({"dtype", "shape"}), or null for a name the signature
// does not list (the servable refuses that by name). ValueError naming
// `what`, the dtype the input expects and the one received otherwise:
// "inputs['text'] expects dtype string. Received: float32".
at::Tensor signature_input(WireTensor w, const Json& spec, const std::string& what);
// An output as the wire carries it: a string tensor (`is_string`: the
// signature's dtype "string") as DT_STRING string_val / KServe BYTES, any
// other as to_tensor_proto / to_infer_output write it.
void output_to_tensor_proto(const at::Tensor& tensor, bool is_string, tensorflow::TensorProto* out);
void output_to_infer_output(const std::string& name, const at::Tensor& tensor, bool is_string,
                            inference::ModelInferResponse::InferOutputTensor* out, std::string* raw);

}  // namespace kiln::serving
