#include "kiln/serving/codec/tensor_proto.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/core/string_tensor.h"

namespace kiln::serving {
namespace {

using tensorflow::DataType;

std::string count_str(int64_t n) { return std::to_string(n); }

Shape decode_shape(const tensorflow::TensorShapeProto& s, const std::string& what) {
  if (s.unknown_rank()) throw ValueError(what + ": tensor_shape has unknown_rank set; send a concrete shape");
  Shape shape;
  for (auto& d : s.dim()) {
    if (d.size() < 0)
      throw ValueError(what + ": tensor_shape has a negative dimension (" + std::to_string(d.size()) +
                       "); every dimension of a request tensor must be known");
    shape.push_back(d.size());
  }
  return shape;
}

// The most elements a request tensor may declare, and the most one value may
// fill (TF's broadcast): limits that no real request reaches, so that a few
// bytes cannot ask for gigabytes (a 20-byte TensorProto with one float_val and
// tensor_shape [2^40] would otherwise allocate 4 TiB).
constexpr int64_t kMaxElements = int64_t{1} << 31;
constexpr int64_t kMaxFillElements = int64_t{1} << 24;

// Element count of `s` (dimensions already checked non-negative); ValueError
// naming `what` beyond kMaxElements, before anything overflows.
int64_t numel_of(const Shape& s, const std::string& what) {
  int64_t n = 1;
  for (auto d : s) {
    if (d == 0) return 0;
  }
  for (auto d : s) {
    if (__builtin_mul_overflow(n, d, &n) || n > kMaxElements)
      throw ValueError(what + ": shape " + shape_to_string(s) + " has more than " + std::to_string(kMaxElements) +
                       " elements; split the request");
  }
  return n;
}

// ValueError when one value would fill more than kMaxFillElements.
void check_fill(int64_t n, const Shape& shape, const std::string& what, const char* field) {
  if (n > kMaxFillElements)
    throw ValueError(what + ": " + field + " holds 1 value to fill tensor_shape " + shape_to_string(shape) + " (" +
                     std::to_string(n) + " elements); one value fills at most " + std::to_string(kMaxFillElements) +
                     ", send every value or tensor_content");
}

// Copies a repeated field's n values into `dst`, converting each to T: one
// memcpy when the types match, else one pass over contiguous memory.
template <typename T, typename Field>
void copy_values(const Field& values, T* dst, int64_t n) {
  using V = std::remove_cv_t<std::remove_reference_t<decltype(*values.data())>>;
  if (n == 0) return;
  if constexpr (std::is_same_v<T, V>) {
    std::memcpy(dst, values.data(), n * sizeof(T));
  } else {
    const V* src = values.data();
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(src[i]);
  }
}

// n values from a typed field into a tensor of `shape` (one value
// broadcasts). T is the element as stored (uint16_t: half/bfloat16 bits).
template <typename T, typename Field>
at::Tensor from_values(const Field& values, const Shape& shape, at::ScalarType type, const std::string& what,
                       const char* field) {
  const int64_t n = numel_of(shape, what);
  const int64_t got = values.size();
  if (got != n && got != 1)
    throw ValueError(what + ": " + field + " holds " + count_str(got) + " values but tensor_shape " +
                     shape_to_string(shape) + " needs " + count_str(n) + " (or exactly 1, which fills the shape)");
  if (got != n) check_fill(n, shape, what, field);
  auto t = at::empty(shape, at::TensorOptions().dtype(type));
  T* dst = static_cast<T*>(t.data_ptr());
  if (got == n) {
    copy_values(values, dst, n);
  } else {
    std::fill(dst, dst + n, static_cast<T>(values.Get(0)));
  }
  return t;
}

at::Tensor from_bytes(const std::string& bytes, const Shape& shape, at::ScalarType type, const std::string& what,
                      const char* field) {
  const int64_t n = numel_of(shape, what);
  const int64_t item = c10::elementSize(type);
  if ((int64_t)bytes.size() != n * item)
    throw ValueError(what + ": " + field + " holds " + count_str(bytes.size()) + " bytes but tensor_shape " +
                     shape_to_string(shape) + " of " + std::string(c10::toString(type)) + " needs " +
                     count_str(n * item) + " (" + count_str(n) + " x " + count_str(item) + ")");
  auto t = at::empty(shape, at::TensorOptions().dtype(type));
  if (n) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  // A bool is one byte, 0 or 1 in C++: any other byte a client sends means
  // true (as in TensorFlow), and is stored as 1 (reading it as bool unfixed
  // is undefined behaviour).
  if (type == at::kBool) t = t.view(at::kByte).ne(0);
  return t;
}

std::string raw_bytes(const at::Tensor& t) {
  auto c = t.contiguous().cpu();
  return std::string(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
}

}  // namespace

at::ScalarType to_scalar_type(DataType dtype, const std::string& what) {
  switch (dtype) {
    case tensorflow::DT_FLOAT:
      return at::kFloat;
    case tensorflow::DT_DOUBLE:
      return at::kDouble;
    case tensorflow::DT_INT32:
      return at::kInt;
    case tensorflow::DT_INT64:
      return at::kLong;
    case tensorflow::DT_INT16:
      return at::kShort;
    case tensorflow::DT_INT8:
      return at::kChar;
    case tensorflow::DT_UINT8:
      return at::kByte;
    case tensorflow::DT_BOOL:
      return at::kBool;
    case tensorflow::DT_HALF:
      return at::kHalf;
    case tensorflow::DT_BFLOAT16:
      return at::kBFloat16;
    default: {
      // Say why for the types a current TensorFlow client can name but kiln
      // cannot hold (types.proto: *_REF are value + 100).
      std::string why;
      if (dtype > 100)
        why = " (a reference dtype: TF1 graph variables, never a value on the wire)";
      else if (dtype == tensorflow::DT_FLOAT8_E5M2 || dtype == tensorflow::DT_FLOAT8_E4M3FN)
        why = " (LibTorch 1.13 has no float8 type; send DT_HALF, DT_BFLOAT16 or DT_FLOAT)";
      else if (dtype == tensorflow::DT_INT4 || dtype == tensorflow::DT_UINT4)
        why = " (no 4-bit integer type in LibTorch 1.13; send DT_INT8 or DT_UINT8)";
      else if (dtype == tensorflow::DT_RESOURCE || dtype == tensorflow::DT_VARIANT)
        why = " (handles and variants only mean something inside one TensorFlow process)";
      throw ValueError(what + ": dtype " + data_type_name(dtype) + " is not supported" + why +
                       "; use DT_FLOAT, DT_DOUBLE, DT_INT32, DT_INT64, DT_INT16, DT_INT8, "
                       "DT_UINT8, DT_BOOL, DT_HALF, DT_BFLOAT16 or DT_STRING");
    }
  }
}

DataType to_data_type(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return tensorflow::DT_FLOAT;
    case at::kDouble:
      return tensorflow::DT_DOUBLE;
    case at::kInt:
      return tensorflow::DT_INT32;
    case at::kLong:
      return tensorflow::DT_INT64;
    case at::kShort:
      return tensorflow::DT_INT16;
    case at::kChar:
      return tensorflow::DT_INT8;
    case at::kByte:
      return tensorflow::DT_UINT8;
    case at::kBool:
      return tensorflow::DT_BOOL;
    case at::kHalf:
      return tensorflow::DT_HALF;
    case at::kBFloat16:
      return tensorflow::DT_BFLOAT16;
    default:
      throw ValueError(std::string("tensor dtype ") + c10::toString(type) + " has no TensorFlow DataType");
  }
}

std::string data_type_name(DataType dtype) {
  const std::string& n = tensorflow::DataType_Name(dtype);
  return n.empty() ? "DataType(" + std::to_string((int)dtype) + ")" : n;
}

void shape_to_proto(const Shape& shape, tensorflow::TensorShapeProto* out) {
  out->Clear();
  for (auto d : shape) out->add_dim()->set_size(d);
}

WireTensor from_tensor_proto(const tensorflow::TensorProto& p, const std::string& what) {
  WireTensor w;
  w.shape = decode_shape(p.tensor_shape(), what);
  const int64_t n = numel_of(w.shape, what);
  if (p.dtype() == tensorflow::DT_STRING) {
    if (!p.tensor_content().empty())
      throw ValueError(what + ": DT_STRING tensors must carry their values in string_val, not tensor_content");
    const int64_t got = p.string_val_size();
    if (got == n) {
      w.strings.assign(p.string_val().begin(), p.string_val().end());
    } else if (got == 1) {
      check_fill(n, w.shape, what, "string_val");
      w.strings.assign(n, p.string_val(0));
    } else {
      throw ValueError(what + ": string_val holds " + count_str(got) + " values but tensor_shape " +
                       shape_to_string(w.shape) + " needs " + count_str(n) + " (or exactly 1, which fills the shape)");
    }
    return w;
  }
  const at::ScalarType type = to_scalar_type(p.dtype(), what);
  if (!p.tensor_content().empty() || n == 0) {
    w.tensor = from_bytes(p.tensor_content(), w.shape, type, what, "tensor_content");
    return w;
  }
  switch (p.dtype()) {
    case tensorflow::DT_FLOAT:
      w.tensor = from_values<float>(p.float_val(), w.shape, type, what, "float_val");
      break;
    case tensorflow::DT_DOUBLE:
      w.tensor = from_values<double>(p.double_val(), w.shape, type, what, "double_val");
      break;
    case tensorflow::DT_INT32:
      w.tensor = from_values<int32_t>(p.int_val(), w.shape, type, what, "int_val");
      break;
    case tensorflow::DT_INT16:
      w.tensor = from_values<int16_t>(p.int_val(), w.shape, type, what, "int_val");
      break;
    case tensorflow::DT_INT8:
      w.tensor = from_values<int8_t>(p.int_val(), w.shape, type, what, "int_val");
      break;
    case tensorflow::DT_UINT8:
      w.tensor = from_values<uint8_t>(p.int_val(), w.shape, type, what, "int_val");
      break;
    case tensorflow::DT_INT64:
      w.tensor = from_values<int64_t>(p.int64_val(), w.shape, type, what, "int64_val");
      break;
    case tensorflow::DT_BOOL:
      w.tensor = from_values<bool>(p.bool_val(), w.shape, type, what, "bool_val");
      break;
    case tensorflow::DT_HALF:
    case tensorflow::DT_BFLOAT16:
      // half_val carries the 16-bit patterns in int32s.
      w.tensor = from_values<uint16_t>(p.half_val(), w.shape, type, what, "half_val");
      break;
    default:
      break;
  }
  return w;
}

void to_tensor_proto(const at::Tensor& tensor, tensorflow::TensorProto* out, TensorEncoding encoding) {
  out->Clear();
  auto t = tensor.contiguous().cpu();
  out->set_dtype(to_data_type(t.scalar_type()));
  shape_to_proto(Shape(t.sizes().begin(), t.sizes().end()), out->mutable_tensor_shape());
  if (encoding == TensorEncoding::kTensorContent) {
    out->set_tensor_content(raw_bytes(t));
    return;
  }
  const int64_t n = t.numel();
  switch (t.scalar_type()) {
    case at::kFloat:
      out->mutable_float_val()->Add(t.data_ptr<float>(), t.data_ptr<float>() + n);
      break;
    case at::kDouble:
      out->mutable_double_val()->Add(t.data_ptr<double>(), t.data_ptr<double>() + n);
      break;
    case at::kLong:
      out->mutable_int64_val()->Add(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + n);
      break;
    case at::kBool:
      out->mutable_bool_val()->Add(t.data_ptr<bool>(), t.data_ptr<bool>() + n);
      break;
    case at::kInt:
      out->mutable_int_val()->Add(t.data_ptr<int32_t>(), t.data_ptr<int32_t>() + n);
      break;
    case at::kShort:
      out->mutable_int_val()->Add(t.data_ptr<int16_t>(), t.data_ptr<int16_t>() + n);
      break;
    case at::kChar:
      out->mutable_int_val()->Add(t.data_ptr<int8_t>(), t.data_ptr<int8_t>() + n);
      break;
    case at::kByte:
      out->mutable_int_val()->Add(t.data_ptr<uint8_t>(), t.data_ptr<uint8_t>() + n);
      break;
    case at::kHalf:
    case at::kBFloat16: {
      const uint16_t* bits = static_cast<const uint16_t*>(t.data_ptr());
      out->mutable_half_val()->Add(bits, bits + n);
      break;
    }
    default:
      break;  // to_data_type has rejected it
  }
}

void to_tensor_proto(const Shape& shape, const std::vector<std::string>& strings, tensorflow::TensorProto* out) {
  out->Clear();
  out->set_dtype(tensorflow::DT_STRING);
  shape_to_proto(shape, out->mutable_tensor_shape());
  for (auto& s : strings) out->add_string_val(s);
}

// --- KServe v2 ----------------------------------------------------------------

std::string kserve_datatype(at::ScalarType type) {
  if (is_string_dtype(type)) return "BYTES";
  switch (type) {
    case at::kFloat:
      return "FP32";
    case at::kDouble:
      return "FP64";
    case at::kHalf:
      return "FP16";
    case at::kBFloat16:
      return "BF16";
    case at::kInt:
      return "INT32";
    case at::kLong:
      return "INT64";
    case at::kShort:
      return "INT16";
    case at::kChar:
      return "INT8";
    case at::kByte:
      return "UINT8";
    case at::kBool:
      return "BOOL";
    default:
      throw ValueError(std::string("tensor dtype ") + c10::toString(type) + " has no KServe datatype");
  }
}

at::ScalarType from_kserve_datatype(const std::string& d, const std::string& what) {
  if (d == "FP32") return at::kFloat;
  if (d == "FP64") return at::kDouble;
  if (d == "FP16") return at::kHalf;
  if (d == "BF16") return at::kBFloat16;
  if (d == "INT32") return at::kInt;
  if (d == "INT64") return at::kLong;
  if (d == "INT16") return at::kShort;
  if (d == "INT8") return at::kChar;
  if (d == "UINT8") return at::kByte;
  if (d == "BOOL") return at::kBool;
  throw ValueError(what + ": datatype '" + d +
                   "' is not supported; use FP32, FP64, FP16, BF16, INT64, INT32, INT16, INT8, UINT8, BOOL or BYTES");
}

WireTensor from_infer_input(const inference::ModelInferRequest::InferInputTensor& in, const std::string* raw) {
  const std::string what = "input '" + in.name() + "'";
  // The protocol forbids both (Triton answers INVALID_ARGUMENT too): reading
  // one would silently drop the other. An empty `contents` holds no data.
  if (raw && in.has_contents() && in.contents().ByteSizeLong() > 0)
    throw ValueError(what +
                     " sets contents, but the request carries raw_input_contents; send every input's data in "
                     "raw_input_contents, or every input's in contents");
  WireTensor w;
  for (auto d : in.shape()) {
    if (d < 0) throw ValueError(what + ": shape has a negative dimension (" + std::to_string(d) + ")");
    w.shape.push_back(d);
  }
  const int64_t n = numel_of(w.shape, what);
  const auto& c = in.contents();
  if (in.datatype() == "BYTES") {
    if (raw) {
      // Each element: 4-byte little-endian length, then the bytes.
      size_t pos = 0;
      while (pos < raw->size()) {
        if (pos + 4 > raw->size()) throw ValueError(what + ": raw BYTES contents end inside a length prefix");
        uint32_t len;
        std::memcpy(&len, raw->data() + pos, 4);
        pos += 4;
        if (pos + len > raw->size())
          throw ValueError(what + ": raw BYTES element of " + std::to_string(len) + " bytes runs past the end");
        w.strings.emplace_back(raw->data() + pos, len);
        pos += len;
      }
    } else {
      w.strings.assign(c.bytes_contents().begin(), c.bytes_contents().end());
    }
    if ((int64_t)w.strings.size() != n)
      throw ValueError(what + ": holds " + count_str(w.strings.size()) + " BYTES elements but shape " +
                       shape_to_string(w.shape) + " needs " + count_str(n));
    return w;
  }
  const at::ScalarType type = from_kserve_datatype(in.datatype(), what);
  if (raw) {
    w.tensor = from_bytes(*raw, w.shape, type, what, "raw_input_contents");
    return w;
  }
  auto check = [&](int64_t got, const char* field) {
    if (got != n)
      throw ValueError(what + ": contents." + field + " holds " + count_str(got) + " values but shape " +
                       shape_to_string(w.shape) + " needs " + count_str(n));
  };
  auto fill = [&]<typename T>(const auto& field, const char* name, T*) {
    check(field.size(), name);
    w.tensor = at::empty(w.shape, at::TensorOptions().dtype(type));
    copy_values(field, static_cast<T*>(w.tensor.data_ptr()), n);
  };
  switch (type) {
    case at::kFloat:
      fill(c.fp32_contents(), "fp32_contents", (float*)nullptr);
      break;
    case at::kDouble:
      fill(c.fp64_contents(), "fp64_contents", (double*)nullptr);
      break;
    case at::kInt:
      fill(c.int_contents(), "int_contents", (int32_t*)nullptr);
      break;
    case at::kShort:
      fill(c.int_contents(), "int_contents", (int16_t*)nullptr);
      break;
    case at::kChar:
      fill(c.int_contents(), "int_contents", (int8_t*)nullptr);
      break;
    case at::kByte:
      fill(c.uint_contents(), "uint_contents", (uint8_t*)nullptr);
      break;
    case at::kLong:
      fill(c.int64_contents(), "int64_contents", (int64_t*)nullptr);
      break;
    case at::kBool:
      fill(c.bool_contents(), "bool_contents", (bool*)nullptr);
      break;
    default:
      throw ValueError(what + ": datatype " + in.datatype() +
                       " has no typed contents field; send it in raw_input_contents");
  }
  return w;
}

void to_infer_output(const std::string& name, const at::Tensor& tensor,
                     inference::ModelInferResponse::InferOutputTensor* out, std::string* raw) {
  auto t = tensor.contiguous().cpu();
  if (t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16) {
    if (!raw) t = t.to(at::kFloat);  // no typed field for 16-bit floats
  }
  out->set_name(name);
  out->set_datatype(kserve_datatype(t.scalar_type()));
  for (auto d : t.sizes()) out->add_shape(d);
  if (raw) {
    *raw = raw_bytes(t);
    return;
  }
  auto* c = out->mutable_contents();
  const int64_t n = t.numel();
  switch (t.scalar_type()) {
    case at::kFloat:
      c->mutable_fp32_contents()->Add(t.data_ptr<float>(), t.data_ptr<float>() + n);
      break;
    case at::kDouble:
      c->mutable_fp64_contents()->Add(t.data_ptr<double>(), t.data_ptr<double>() + n);
      break;
    case at::kLong:
      c->mutable_int64_contents()->Add(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + n);
      break;
    case at::kBool:
      c->mutable_bool_contents()->Add(t.data_ptr<bool>(), t.data_ptr<bool>() + n);
      break;
    case at::kByte:
      c->mutable_uint_contents()->Add(t.data_ptr<uint8_t>(), t.data_ptr<uint8_t>() + n);
      break;
    case at::kShort:
      c->mutable_int_contents()->Add(t.data_ptr<int16_t>(), t.data_ptr<int16_t>() + n);
      break;
    case at::kChar:
      c->mutable_int_contents()->Add(t.data_ptr<int8_t>(), t.data_ptr<int8_t>() + n);
      break;
    default:  // int32
      c->mutable_int_contents()->Add(t.data_ptr<int32_t>(), t.data_ptr<int32_t>() + n);
  }
}

void to_infer_output(const std::string& name, const Shape& shape, const std::vector<std::string>& strings,
                     inference::ModelInferResponse::InferOutputTensor* out, std::string* raw) {
  out->set_name(name);
  out->set_datatype("BYTES");
  for (auto d : shape) out->add_shape(d);
  if (raw) {
    raw->clear();
    for (auto& s : strings) {
      uint32_t len = s.size();
      raw->append(reinterpret_cast<const char*>(&len), 4);
      raw->append(s);
    }
    return;
  }
  for (auto& s : strings) out->mutable_contents()->add_bytes_contents(s);
}

// --- Signatures ---------------------------------------------------------------

at::Tensor signature_input(WireTensor w, const Json& spec, const std::string& what) {
  if (!spec.is_object() || !spec.contains("dtype")) {
    if (w.is_string()) return strings::encode(w.strings, w.shape);  // unknown input: the servable names it
    return std::move(w.tensor);
  }
  const std::string want = spec["dtype"].get<std::string>();
  const bool want_string = is_string_dtype(dtype_from_string(want));
  if (want_string != w.is_string())
    throw ValueError(what + " expects dtype " + want + ". Received: " +
                     (w.is_string() ? dtype_to_string(kStringDType) : dtype_to_string(w.tensor.scalar_type())));
  if (w.is_string()) return strings::encode(w.strings, w.shape);
  return std::move(w.tensor);
}

void output_to_tensor_proto(const at::Tensor& tensor, bool is_string, tensorflow::TensorProto* out) {
  if (!is_string) return to_tensor_proto(tensor, out);
  const at::Tensor t = tensor.cpu();
  to_tensor_proto(strings::logical_shape(t), strings::decode(t), out);
}

void output_to_infer_output(const std::string& name, const at::Tensor& tensor, bool is_string,
                            inference::ModelInferResponse::InferOutputTensor* out, std::string* raw) {
  if (!is_string) return to_infer_output(name, tensor, out, raw);
  const at::Tensor t = tensor.cpu();
  to_infer_output(name, strings::logical_shape(t), strings::decode(t), out, raw);
}

}  // namespace kiln::serving
