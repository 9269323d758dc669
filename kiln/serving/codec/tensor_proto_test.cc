#include "kiln/serving/codec/tensor_proto.h"

#include <gtest/gtest.h>

#include "kiln/core/error.h"
#include "kiln/testing/expect_error.h"

namespace kiln::serving {
namespace {

tensorflow::TensorProto proto_with_shape(tensorflow::DataType dtype, Shape shape) {
  tensorflow::TensorProto p;
  p.set_dtype(dtype);
  shape_to_proto(shape, p.mutable_tensor_shape());
  return p;
}

TEST(TensorProto, DataTypeNumbersAreTensorFlows) {
  EXPECT_EQ(tensorflow::DT_FLOAT, 1);
  EXPECT_EQ(tensorflow::DT_DOUBLE, 2);
  EXPECT_EQ(tensorflow::DT_INT32, 3);
  EXPECT_EQ(tensorflow::DT_UINT8, 4);
  EXPECT_EQ(tensorflow::DT_INT8, 6);
  EXPECT_EQ(tensorflow::DT_STRING, 7);
  EXPECT_EQ(tensorflow::DT_INT64, 9);
  EXPECT_EQ(tensorflow::DT_BOOL, 10);
  EXPECT_EQ(tensorflow::DT_BFLOAT16, 14);
  EXPECT_EQ(tensorflow::DT_HALF, 19);
  // Field numbers of TensorProto as TensorFlow defines them.
  auto* d = tensorflow::TensorProto::descriptor();
  EXPECT_EQ(d->FindFieldByName("tensor_content")->number(), 4);
  EXPECT_EQ(d->FindFieldByName("float_val")->number(), 5);
  EXPECT_EQ(d->FindFieldByName("int64_val")->number(), 10);
  EXPECT_EQ(d->FindFieldByName("half_val")->number(), 13);
  EXPECT_EQ(d->FindFieldByName("uint64_val")->number(), 17);
}

TEST(TensorProto, RoundTripsEveryDtypeInBothEncodings) {
  std::vector<at::Tensor> tensors = {
      at::randn({2, 3}),
      at::randn({4}, at::kDouble),
      at::arange(-3, 3, at::kInt).reshape({2, 3}),
      at::arange(-3, 3, at::kLong).reshape({3, 2}),
      at::arange(-3, 3, at::kShort),
      at::arange(-3, 3, at::kChar),
      at::arange(250, 256).to(at::kByte),
      at::tensor({1, 0, 1}).to(at::kBool),
      at::randn({2, 2}).to(at::kHalf),
      at::randn({3}).to(at::kBFloat16),
      at::zeros({0, 5}),
      at::tensor(2.5f),  // rank 0
  };
  for (auto enc : {TensorEncoding::kTypedValues, TensorEncoding::kTensorContent}) {
    for (auto& t : tensors) {
      tensorflow::TensorProto p;
      to_tensor_proto(t, &p, enc);
      // Through the wire, not just the object.
      tensorflow::TensorProto q;
      ASSERT_TRUE(q.ParseFromString(p.SerializeAsString()));
      if (t.numel() > 0) EXPECT_EQ(enc == TensorEncoding::kTensorContent, !q.tensor_content().empty());
      WireTensor w = from_tensor_proto(q, "t");
      ASSERT_FALSE(w.is_string());
      EXPECT_EQ(w.tensor.scalar_type(), t.scalar_type()) << c10::toString(t.scalar_type());
      EXPECT_EQ(w.tensor.sizes(), t.sizes());
      EXPECT_TRUE(at::equal(w.tensor, t)) << c10::toString(t.scalar_type());
    }
  }
}

TEST(TensorProto, TypedFieldsByDtypeAsTensorFlowUsesThem) {
  tensorflow::TensorProto p;
  to_tensor_proto(at::arange(3, at::kByte), &p);
  EXPECT_EQ(p.int_val_size(), 3);  // uint8 travels in int_val
  to_tensor_proto(at::ones({2}).to(at::kHalf), &p);
  ASSERT_EQ(p.half_val_size(), 2);
  EXPECT_EQ(p.half_val(0), 0x3C00);  // 1.0 in IEEE half
  to_tensor_proto(at::ones({1}).to(at::kBFloat16), &p);
  EXPECT_EQ(p.half_val(0), 0x3F80);  // 1.0 in bfloat16
}

TEST(TensorProto, SingleTypedValueFillsTheShape) {
  auto p = proto_with_shape(tensorflow::DT_FLOAT, {2, 3});
  p.add_float_val(7.5f);
  auto w = from_tensor_proto(p, "x");
  EXPECT_TRUE(at::equal(w.tensor, at::full({2, 3}, 7.5f)));
  auto s = proto_with_shape(tensorflow::DT_STRING, {3});
  s.add_string_val("ab");
  w = from_tensor_proto(s, "s");
  EXPECT_EQ(w.strings, (std::vector<std::string>{"ab", "ab", "ab"}));
}

TEST(TensorProto, StringsRoundTripAsBytes) {
  tensorflow::TensorProto p;
  std::vector<std::string> in = {"a", std::string("\0\xff", 2), ""};
  to_tensor_proto(Shape{3, 1}, in, &p);
  auto w = from_tensor_proto(p, "s");
  ASSERT_TRUE(w.is_string());
  EXPECT_EQ(w.shape, (Shape{3, 1}));
  EXPECT_EQ(w.strings, in);
}

TEST(TensorProto, SizeMismatchesAreClearErrors) {
  auto p = proto_with_shape(tensorflow::DT_FLOAT, {2, 3});
  p.add_float_val(1);
  p.add_float_val(2);
  expect_error<ValueError>(
      [&] { from_tensor_proto(p, "inputs['x']"); },
      {"inputs['x']: float_val holds 2 values but tensor_shape (2, 3) needs 6 (or exactly 1, which fills the "
       "shape)"});
  auto c = proto_with_shape(tensorflow::DT_INT64, {4});
  c.set_tensor_content(std::string(31, '\0'));
  expect_error<ValueError>([&] { from_tensor_proto(c, "x"); }, {"tensor_content holds 31 bytes"});
  auto e = proto_with_shape(tensorflow::DT_FLOAT, {2});  // no values at all
  expect_error<ValueError>([&] { from_tensor_proto(e, "x"); }, {"holds 0 values"});
  auto u = proto_with_shape(tensorflow::DT_COMPLEX64, {1});
  expect_error<ValueError>([&] { from_tensor_proto(u, "x"); }, {"DT_COMPLEX64 is not supported"});
  auto n = proto_with_shape(tensorflow::DT_FLOAT, {-1, 2});
  expect_error<ValueError>([&] { from_tensor_proto(n, "x"); }, {"negative dimension"});
}

// A few bytes must not ask for gigabytes: a 20-byte TensorProto with one
// float_val and a huge tensor_shape used to allocate (or overflow the element
// count, undefined behaviour) before the values were counted. Found by
// fuzz/tensor_proto_fuzz.cc.
// Found by tensor_proto_fuzz: raw bool bytes other than 0 and 1 were kept
// as they came, and encoding the tensor back read them as bool (undefined
// behaviour, caught by UBSan). Any nonzero byte is true.
TEST(TensorProto, RawBoolBytesOtherThanZeroAndOneAreTrue) {
  auto p = proto_with_shape(tensorflow::DT_BOOL, {3});
  p.set_tensor_content(std::string("\x00\x02\xc4", 3));
  WireTensor w = from_tensor_proto(p, "x");
  ASSERT_EQ(w.tensor.scalar_type(), at::kBool);
  EXPECT_EQ(w.tensor.view(at::kByte).sum().item<int64_t>(), 2);  // stored as 0, 1, 1
  tensorflow::TensorProto back;
  to_tensor_proto(w.tensor, &back);
  EXPECT_EQ(std::vector<bool>(back.bool_val().begin(), back.bool_val().end()), (std::vector<bool>{false, true, true}));
  inference::ModelInferRequest::InferInputTensor in;
  in.set_name("x");
  in.set_datatype("BOOL");
  in.add_shape(3);
  const std::string raw("\x00\x02\xc4", 3);
  WireTensor k = from_infer_input(in, &raw);
  EXPECT_EQ(k.tensor.view(at::kByte).sum().item<int64_t>(), 2);
}

TEST(TensorProto, HugeShapesAreRefusedBeforeAnyAllocation) {
  auto fill = proto_with_shape(tensorflow::DT_FLOAT, {int64_t{1} << 40});
  fill.add_float_val(1);
  expect_error<ValueError>([&] { from_tensor_proto(fill, "x"); }, {"has more than 2147483648 elements"});
  auto big_fill = proto_with_shape(tensorflow::DT_DOUBLE, {1 << 14, 1 << 14});
  big_fill.add_double_val(1);
  expect_error<ValueError>([&] { from_tensor_proto(big_fill, "x"); }, {"one value fills at most 16777216"});
  auto strings = proto_with_shape(tensorflow::DT_STRING, {1 << 30});
  strings.add_string_val("a");
  expect_error<ValueError>([&] { from_tensor_proto(strings, "x"); }, {"one value fills at most"});
  auto overflow = proto_with_shape(tensorflow::DT_INT64, {int64_t{1} << 62, 8});
  overflow.set_tensor_content(std::string(8, '\0'));
  expect_error<ValueError>([&] { from_tensor_proto(overflow, "x"); }, {"elements; split the request"});
  inference::ModelInferRequest::InferInputTensor in;
  in.set_name("x");
  in.set_datatype("FP32");
  in.add_shape(int64_t{1} << 62);
  in.add_shape(4);
  expect_error<ValueError>([&] { from_infer_input(in, nullptr); }, {"elements; split the request"});
}

TEST(KServeTensor, RoundTripsContentsAndRawInEveryDtype) {
  std::vector<at::Tensor> tensors = {
      at::randn({2, 3}),
      at::randn({4}, at::kDouble),
      at::arange(-3, 3, at::kInt),
      at::arange(-3, 3, at::kLong),
      at::arange(-3, 3, at::kChar),
      at::arange(250, 256).to(at::kByte),
      at::tensor({1, 0}).to(at::kBool),
  };
  for (bool use_raw : {false, true}) {
    for (auto& t : tensors) {
      inference::ModelInferResponse::InferOutputTensor out;
      std::string raw;
      to_infer_output("y", t, &out, use_raw ? &raw : nullptr);
      inference::ModelInferRequest::InferInputTensor in;
      in.set_name(out.name());
      in.set_datatype(out.datatype());
      *in.mutable_shape() = out.shape();
      *in.mutable_contents() = out.contents();
      auto w = from_infer_input(in, use_raw ? &raw : nullptr);
      EXPECT_TRUE(at::equal(w.tensor, t)) << out.datatype() << " raw=" << use_raw;
    }
  }
  // FP16 only travels raw.
  auto h = at::randn({3}).to(at::kHalf);
  inference::ModelInferResponse::InferOutputTensor out;
  std::string raw;
  to_infer_output("h", h, &out, &raw);
  EXPECT_EQ(out.datatype(), "FP16");
  inference::ModelInferRequest::InferInputTensor in;
  in.set_datatype("FP16");
  in.add_shape(3);
  EXPECT_TRUE(at::equal(from_infer_input(in, &raw).tensor, h));
}

TEST(KServeTensor, BytesRawIsLengthPrefixed) {
  inference::ModelInferResponse::InferOutputTensor out;
  std::string raw;
  to_infer_output("s", Shape{2}, {"hi", "kiln"}, &out, &raw);
  EXPECT_EQ(raw, std::string("\x02\0\0\0hi\x04\0\0\0kiln", 14));
  inference::ModelInferRequest::InferInputTensor in;
  in.set_name("s");
  in.set_datatype("BYTES");
  in.add_shape(2);
  EXPECT_EQ(from_infer_input(in, &raw).strings, (std::vector<std::string>{"hi", "kiln"}));
  std::string cut = raw.substr(0, 11);  // the second element is cut short
  expect_error<ValueError>([&] { from_infer_input(in, &cut); }, {"runs past the end"});
}

TEST(KServeTensor, MismatchesAreClearErrors) {
  inference::ModelInferRequest::InferInputTensor in;
  in.set_name("x");
  in.set_datatype("FP32");
  in.add_shape(2);
  in.add_shape(2);
  in.mutable_contents()->add_fp32_contents(1);
  expect_error<ValueError>([&] { from_infer_input(in, nullptr); },
                           {"input 'x': contents.fp32_contents holds 1 values but shape (2, 2) needs 4"});
  // Values in contents and raw_input_contents both: the protocol forbids it.
  std::string raw(15, '\0');
  expect_error<ValueError>([&] { from_infer_input(in, &raw); },
                           {"input 'x' sets contents, but the request carries raw_input_contents"});
  in.clear_contents();
  expect_error<ValueError>([&] { from_infer_input(in, &raw); }, {"raw_input_contents holds 15 bytes"});
  in.set_datatype("FP8");
  expect_error<ValueError>([&] { from_infer_input(in, nullptr); }, {"datatype 'FP8' is not supported"});
}

// The dtypes a current TensorFlow client can name but kiln cannot hold are
// refused by name with the reason, whatever field carries the values
// (float8_val, resource_handle_val, variant_val: predict.proto's newer fields).
TEST(TensorProto, NewerUpstreamDtypesAreRefusedWithTheReason) {
  auto f8 = proto_with_shape(tensorflow::DT_FLOAT8_E4M3FN, {2});
  f8.set_float8_val(std::string(2, '\x38'));
  expect_error<ValueError>([&] { from_tensor_proto(f8, "inputs['x']"); },
                           {"inputs['x']: dtype DT_FLOAT8_E4M3FN is not supported (LibTorch 1.13 has no float8 type"});
  auto i4 = proto_with_shape(tensorflow::DT_UINT4, {1});
  expect_error<ValueError>([&] { from_tensor_proto(i4, "x"); }, {"DT_UINT4 is not supported (no 4-bit"});
  auto ref = proto_with_shape(tensorflow::DT_FLOAT_REF, {1});
  ref.add_float_val(1);
  expect_error<ValueError>([&] { from_tensor_proto(ref, "x"); }, {"DT_FLOAT_REF is not supported (a reference dtype"});
  auto res = proto_with_shape(tensorflow::DT_RESOURCE, {1});
  res.add_resource_handle_val()->set_name("v");
  expect_error<ValueError>([&] { from_tensor_proto(res, "x"); }, {"DT_RESOURCE is not supported (handles"});
  auto var = proto_with_shape(tensorflow::DT_VARIANT, {1});
  var.add_variant_val()->set_type_name("tensorflow::Tensor");
  expect_error<ValueError>([&] { from_tensor_proto(var, "x"); }, {"DT_VARIANT is not supported"});
}

// Upstream's numbers for the values added with issue 15 (types.proto).
TEST(TensorProto, NewerDataTypeNumbersAreTensorFlows) {
  EXPECT_EQ(tensorflow::DT_FLOAT8_E5M2, 24);
  EXPECT_EQ(tensorflow::DT_FLOAT8_E4M3FN, 25);
  EXPECT_EQ(tensorflow::DT_INT4, 29);
  EXPECT_EQ(tensorflow::DT_UINT4, 30);
  EXPECT_EQ(tensorflow::DT_FLOAT_REF, 101);
  EXPECT_EQ(tensorflow::DT_UINT4_REF, 130);
}

}  // namespace
}  // namespace kiln::serving
