// The REST predict fast path (simdjson, no DOM) against the DOM path: for
// every body the fast path takes, both give the same call bit for bit; every
// other body is left to the DOM path, which accepts it or words the error.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>

#include "kiln/serving/codec/rest_codec.h"
#include "kiln/serving/rest/rest_server.h"
#include "kiln/serving/status.h"

namespace kiln::serving {
namespace {

Json one_input_signatures(const std::string& dtype) {
  return Json{{"serving_default", {{"inputs", {{"x", {{"dtype", dtype}}}}}}},
              {"other", {{"inputs", {{"y", {{"dtype", "float64"}}}}}}},
              {"two", {{"inputs", {{"a", {{"dtype", "float32"}}}, {"b", {{"dtype", "float32"}}}}}}}};
}

PredictCall dom_call(const std::string& body, const Json& sigs) {
  return decode_predict_request(parse_request_json(body, 64), sigs);
}

void expect_same_call(const PredictCall& a, const PredictCall& b, const std::string& body) {
  EXPECT_EQ(a.signature_name, b.signature_name) << body;
  EXPECT_EQ(a.row_format, b.row_format) << body;
  ASSERT_EQ(a.inputs.size(), b.inputs.size()) << body;
  for (auto& [name, t] : a.inputs) {
    ASSERT_TRUE(b.inputs.count(name)) << body;
    const at::Tensor& u = b.inputs.at(name);
    EXPECT_EQ(t.scalar_type(), u.scalar_type()) << body;
    EXPECT_EQ(t.sizes(), u.sizes()) << body;
    EXPECT_TRUE(at::equal(t, u)) << body;  // bit-equal, not close
  }
}

// Takes the fast path and agrees with the DOM path.
void expect_fast(const std::string& body, const Json& sigs) {
  PredictCall fast;
  ASSERT_TRUE(decode_predict_fast(body, sigs, &fast)) << body;
  expect_same_call(fast, dom_call(body, sigs), body);
}

// Left to the DOM path.
void expect_fallback(const std::string& body, const Json& sigs) {
  PredictCall call;
  EXPECT_FALSE(decode_predict_fast(body, sigs, &call)) << body;
}

TEST(RestFastPath, CommonBodiesAgreeWithTheDomPath) {
  Json f32 = one_input_signatures("float32");
  expect_fast(R"({"instances": [[1, 2.5, -3e-2], [0, 0.0039215688593685627, 1E3]]})", f32);
  expect_fast(R"({"instances": [1.5, 2, 3]})", f32);                           // scalar instances
  expect_fast(R"({"instances": [[[1, 2], [3, 4]], [[5, 6], [7, 8]]]})", f32);  // 2x2 per row
  expect_fast(R"({"inputs": [[1, 2], [3, 4], [5, 6]]})", f32);                 // columnar
  expect_fast(R"(  {"signature_name": "other", "instances": [[1e308, -4.9e-324]]}  )", f32);
  expect_fast(R"({"instances": [[1, 2]], "signature_name": ""})", f32);  // "" means the default
  expect_fast(R"({"instances":[[3.4028234663852886e38, 1.17549435e-38, 16777217]]})", f32);
  expect_fast(R"({"instances": [[1, -2, 9007199254740993]]})", one_input_signatures("int64"));
  expect_fast(R"({"instances": [[0, 1, 1]]})", one_input_signatures("bool"));
  expect_fast(R"({"instances": [[255, 0]]})", one_input_signatures("uint8"));
  expect_fast(R"({"instances": [[0.1, 0.2]]})", one_input_signatures("float64"));
}

// simdjson 3.0.1 misreads a number whose integer part is 0 and whose
// fraction has more than 19 digits (0.111111111111111111110 as 4.3e-4);
// fuzz/rest_predict_fuzz found it. The fast path reads long tokens again.
TEST(RestFastPath, LongFractionsAreReadCorrectlyRounded) {
  Json f32 = one_input_signatures("float32");
  Json f64 = one_input_signatures("float64");
  const std::string long_fraction = "0.111111111111111111111111111111111111111111111111111110";
  for (const Json* sigs : {&f32, &f64}) {
    expect_fast(R"({"instances": [[-)" + long_fraction + R"(, 1e-1539]]})", *sigs);
    expect_fast(R"({"instances": [[0.111111111111111111110, -0.95000000000000000000]]})", *sigs);
    expect_fast(R"({"instances": [[)" + long_fraction + " \n\t, 2]]}", *sigs);  // blanks after the token
    expect_fast(R"({"inputs": [)" + long_fraction + "]}", *sigs);               // columnar
  }
  PredictCall fast;
  ASSERT_TRUE(decode_predict_fast(R"({"instances": [[0.123456789012345678901]]})", f64, &fast));
  EXPECT_EQ(fast.inputs.begin()->second.item<double>(), 0.12345678901234567890);
  // Out of range for from_chars: the DOM path reads it (as strtod does).
  expect_fallback(R"({"instances": [[1.00000000000000000000000e-400]]})", f32);
}

TEST(RestFastPath, EverythingElseIsLeftToTheDomPath) {
  Json f32 = one_input_signatures("float32");
  for (const char* body : {
           R"({"instances": [[NaN, 1]]})",         // bare NaN: the DOM path rewrites it
           R"({"instances": [["NaN", 1]]})",       // strings
           R"({"instances": [[true, 1]]})",        // bools
           R"({"instances": [{"b64": "AAAA"}]})",  // base64
           R"({"instances": [{"x": [1, 2]}]})",    // named instances
           R"({"instances": [[1, 2], [3]]})",      // ragged
           R"({"instances": [[1], [[2]]]})",       // mixed depth
           R"({"instances": [[1, [2]]]})",         // a list where the row holds numbers
           R"({"instances": [[[1]], [2]]})",       // a number where rows hold lists
           R"({"instances": [[1], 2]})",
           R"({"instances": [["a"], [1]]})",
           R"({"inputs": 7})",      // a bare number (a scalar input)
           R"({"instances": []})",  // empty
           R"({"instances": [[]]})",
           R"({"instances": [[1]]} trailing)",  // trailing content
           R"({"instances": [[1]]} {"instances": [[2]]})",
           R"({"instances": [[1]], "extra": 1})",          // unknown key
           R"({"instances": [[1]], "instances": [[2]]})",  // repeated key
           R"({"instances": [[1]], "inputs": [[2]]})",     // both formats
           R"({"signature_name": "nope", "instances": [[1]]})",
           R"({"signature_name": "two", "instances": [[1]]})",  // several inputs
           R"({"signature_name": 3, "instances": [[1]]})",
           R"({"instances": [[01]]})",  // not JSON numbers
           R"({"instances": [[1.]]})",
           R"({"instances": [[.5]]})",
           R"({"instances": [[+1]]})",
           R"({"instances": [[1, 2]])",  // truncated
           R"({"instances": [[1, 2)",
           R"([[1, 2]])",  // not an object
           "",
       })
    expect_fallback(body, f32);
  expect_fallback(R"({"instances": [[1.5]]})", one_input_signatures("int32"));  // DOM words the error
  expect_fallback(R"({"instances": [[1e400]]})", one_input_signatures("int64"));
  expect_fallback("{\"instances\": " + std::string(40, '[') + "1" + std::string(40, ']') + "}", f32);

  // What the DOM path then does with some of them.
  EXPECT_TRUE(std::isnan(dom_call(R"({"instances": [[NaN, 1]]})", f32).inputs["x"][0][0].item<float>()));
  EXPECT_THROW(dom_call(R"({"instances": [[1, 2], [3]]})", f32), ServingError);
  EXPECT_THROW(dom_call(R"({"instances": [[1.5]]})", one_input_signatures("int32")), ServingError);
  EXPECT_THROW(dom_call(R"({"instances": [[1]]} trailing)", f32), ServingError);
}

// Found by rest_predict_fuzz: an empty base64 value made a tensor with no
// storage and copied zero bytes into its null data pointer (UBSan's nonnull).
TEST(RestCodec, AnEmptyBase64ValueIsAnEmptyExample) {
  Json f32 = one_input_signatures("float32");
  PredictCall call = dom_call(R"({"instances": [{"b64": ""}]})", f32);
  EXPECT_EQ(call.inputs["x"].numel(), 0);
  Json shaped{{"serving_default", {{"inputs", {{"x", {{"dtype", "float32"}, {"shape", {-1, 2}}}}}}}}};
  EXPECT_THROW(dom_call(R"({"instances": [{"b64": ""}]})", shaped), ServingError);  // one example holds 2 values
}

// Random rectangular bodies in many number spellings: the fast path takes
// every one and agrees bit for bit with the DOM path.
TEST(RestFastPath, RandomBodiesAgreeBitForBit) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> dims(1, 3), len(1, 5), kind(0, 5);
  std::uniform_real_distribution<double> real(-1e3, 1e3);
  Json f32 = one_input_signatures("float32"), f64 = one_input_signatures("float64");
  auto number = [&]() -> std::string {
    char buf[64];
    switch (kind(rng)) {
      case 0:
        return std::to_string((int)real(rng));
      case 1:
        std::snprintf(buf, sizeof buf, "%.17g", real(rng));
        return buf;
      case 2:
        std::snprintf(buf, sizeof buf, "%.9g", (float)real(rng));
        return buf;
      case 3:
        std::snprintf(buf, sizeof buf, "%.6e", real(rng) * 1e-30);
        return buf;
      case 4:
        std::snprintf(buf, sizeof buf, "%.3E", real(rng) * 1e30);
        return buf;
      default:
        return "-0.0";
    }
  };
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int> shape(dims(rng));
    for (auto& d : shape) d = len(rng);
    std::function<std::string(size_t)> lists = [&](size_t depth) -> std::string {
      if (depth == shape.size()) return number();
      std::string s = "[";
      for (int i = 0; i < shape[depth]; ++i) s += (i ? ", " : "") + lists(depth + 1);
      return s + "]";
    };
    std::string body = std::string("{\"") + (trial % 2 ? "instances" : "inputs") + "\": " + lists(0) + "}";
    expect_fast(body, trial % 3 ? f32 : f64);
  }
}

// KServe v2 infer: the fast decoder and the DOM decoder agree.
void expect_same_kserve(const std::string& body) {
  KServeInferBody fast;
  ASSERT_TRUE(decode_kserve_infer_fast(body, &fast)) << body;
  KServeInferBody dom = decode_kserve_infer(parse_request_json(body, 64));
  ASSERT_EQ(fast.inputs.size(), dom.inputs.size()) << body;
  for (size_t i = 0; i < fast.inputs.size(); ++i) {
    const auto &f = fast.inputs[i], &d = dom.inputs[i];
    EXPECT_EQ(f.name, d.name);
    EXPECT_EQ(f.datatype, d.datatype);
    EXPECT_EQ(f.shape, d.shape);
    ASSERT_TRUE(f.has_numbers);
    at::Tensor want = json_to_tensor(d.data, at::kDouble, "data").reshape({-1});
    at::Tensor got = numbers_to_tensor(f.numbers, {(int64_t)f.numbers.size()}, at::kDouble);
    EXPECT_TRUE(at::equal(got, want)) << body;
  }
  EXPECT_EQ(fast.outputs, dom.outputs) << body;
  EXPECT_EQ(fast.id, dom.id) << body;
}

TEST(RestFastPath, KServeInferBodiesAgreeWithTheDomPath) {
  expect_same_kserve(
      R"({"id": "r1", "inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [1, 2.5, -3e2, 0]}]})");
  expect_same_kserve(R"({"inputs": [{"data": [[1, 2], [3, 4]], "datatype": "INT64", "shape": [2, 2], "name": "x"}]})");
  expect_same_kserve(R"({"inputs": [{"name": "a", "shape": [1], "datatype": "FP64", "data": [0.1]},
                                    {"name": "b", "shape": [0, 3], "datatype": "FP32", "data": [7]}],
                         "outputs": [{"name": "p"}, {"name": "q"}]})");
  for (
      const char* body : {
          R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1], "parameters": {}}]})",
          R"({"inputs": [{"name": "x", "shape": [1], "datatype": "BYTES", "data": ["abc"]}]})",
          R"({"inputs": [{"name": "x", "shape": [-1], "datatype": "FP32", "data": [1]}]})",
          R"({"inputs": [{"name": "x", "shape": [1.0], "datatype": "FP32", "data": [1]}]})",
          R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32"}]})",
          R"({"inputs": [{"name": "x", "name": "y", "shape": [1], "datatype": "FP32", "data": [1]}]})",
          R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": 1}]})",
          R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [NaN]}]})",
          R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]} x)",
          R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}], "id": 7})",
          R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}], "parameters": {}})",
          R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}], "outputs": [{"name": "p", "x": 1}]})",
          R"({"inputs": 3})",
          R"({"id": "only"})",
      }) {
    KServeInferBody b;
    EXPECT_FALSE(decode_kserve_infer_fast(body, &b)) << body;
  }
  // The DOM decoder words the errors the fast one leaves to it.
  EXPECT_THROW(decode_kserve_infer(parse_request_json(R"({"inputs": 3})", 64)), ServingError);
  EXPECT_THROW(decode_kserve_infer(parse_request_json(
                   R"({"inputs": [{"name": "x", "shape": [-1], "datatype": "FP32", "data": [1]}]})", 64)),
               ServingError);
  // Integral data must be integers, on either path.
  EXPECT_THROW(checked_numbers_to_tensor({1.5}, {1}, at::kInt, "input \"x\""), ServingError);
}

TEST(RestFastPath, ResponseTextParsesBackToTheSameValues) {
  at::Tensor probs = at::rand({3, 4});
  probs[1][2] = std::numeric_limits<float>::quiet_NaN();
  probs[2][0] = std::numeric_limits<float>::infinity();
  probs[0][1] = 1e-40f;  // subnormal
  for (bool rows : {true, false}) {
    // Bare NaN / Infinity are not JSON: read back as a TF Serving client
    // (or kiln's request parser) does.
    Json j = parse_request_json(predict_response_text({{"p", probs}}, rows), 64);
    const Json& v = j[rows ? "predictions" : "outputs"];
    ASSERT_EQ(v.size(), 3u);
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t k = 0; k < 4; ++k) {
        float want = probs[i][k].item<float>();
        if (std::isnan(want))
          EXPECT_EQ(v[i][k], "NaN");
        else if (std::isinf(want))
          EXPECT_EQ(v[i][k], "Infinity");
        else
          EXPECT_EQ(v[i][k].get<float>(), want) << i << "," << k;  // shortest form, same float
      }
  }
  // Integers, doubles, and several outputs say the same as encode_predict_response
  // (float32 values in other digits: the same float).
  std::function<bool(const Json&, const Json&)> same = [&](const Json& a, const Json& b) {
    if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>() || a.get<float>() == b.get<float>();
    if (a.type() != b.type() || a.size() != b.size()) return false;
    if (a.is_array()) {
      for (size_t i = 0; i < a.size(); ++i)
        if (!same(a[i], b[i])) return false;
      return true;
    }
    if (a.is_object()) {
      for (auto& [k, v] : a.items())
        if (!b.contains(k) || !same(v, b[k])) return false;
      return true;
    }
    return a == b;
  };
  at::Tensor classes = at::arange(6, at::kLong).reshape({3, 2}) - 2;
  at::Tensor d = at::rand({2}, at::kDouble);
  at::Tensor finite = at::rand({3, 4});
  at::Tensor scalar = at::scalar_tensor(7.0f);
  at::Tensor short_batch = at::rand({2, 2});  // fewer rows than the others: written whole
  for (const TensorMap& out : {TensorMap{{"c", classes}}, TensorMap{{"d", d}}, TensorMap{{"c", classes}, {"p", finite}},
                               TensorMap{{"c", classes}, {"s", scalar}}, TensorMap{{"c", classes}, {"q", short_batch}},
                               TensorMap{{"s", scalar}, {"z", at::scalar_tensor(2, at::kLong)}}})
    for (bool rows : {true, false})
      EXPECT_TRUE(same(Json::parse(predict_response_text(out, rows)), encode_predict_response(out, rows)))
          << predict_response_text(out, rows);
}

// Finite floats digit for digit as TF Serving's WriteDecimal writes them
// (json_tensor.cc): %g, else max_digits10 digits, then ".0" on a whole
// number without an exponent. The expected strings are what that
// algorithm prints (checked with numpy's float32/float64 and printf).
TEST(RestCodec, FloatsAreWrittenDigitForDigitAsTfServingWritesThem) {
  at::Tensor f =
      at::tensor({1.0f, 0.1f, 1e6f, 0.123456789f, 9000000.0f, 3e-5f, -2.0f, 100000.0f, 1234567.0f, 1.0f / 3.0f, 0.0f});
  EXPECT_EQ(predict_response_text({{"p", f}}, true),
            R"({"predictions":[1.0,0.1,1e+06,0.123456791,9e+06,3e-05,-2.0,100000.0,1234567.0,0.333333343,0.0]})");
  at::Tensor d = at::tensor({1.0, 0.1, 1.0 / 3.0, 1e22, -0.0}, at::kDouble);
  EXPECT_EQ(predict_response_text({{"p", d}}, false), R"({"outputs":[1.0,0.1,0.33333333333333331,1e+22,-0.0]})");
  // Integers stay integers; kiln's own JSON (kiln predict) keeps the shortest form.
  EXPECT_EQ(predict_response_text({{"c", at::tensor({1, -2}, at::kLong)}}, true), R"({"predictions":[1,-2]})");
  std::string shortest;
  append_tensor_json(shortest, f.slice(0, 0, 4));
  EXPECT_EQ(shortest, "[1,0.1,1e+06,0.12345679]");
}

// Classify and regress replies write their scores as predict does, NaN included.
TEST(RestCodec, ClassifyAndRegressRepliesWriteFloatsAsTfServing) {
  Classifications c;
  c.examples = 2;
  c.classes = 2;
  c.labels = {"cat", "dog", "cat", "dog"};
  c.scores = {0.75f, 0.25f, 1.0f, std::numeric_limits<float>::quiet_NaN()};
  EXPECT_EQ(classify_result_text(c), R"({"result":[[["cat",0.75],["dog",0.25]],[["cat",1.0],["dog",NaN]]]})");
  c.labels.clear();  // the class index is the label
  EXPECT_EQ(classify_result_text(c), R"({"result":[[["0",0.75],["1",0.25]],[["0",1.0],["1",NaN]]]})");
  EXPECT_EQ(regress_result_text({2.0f, -std::numeric_limits<float>::infinity(), 0.1f}),
            R"({"result":[2.0,-Infinity,0.1]})");
}

// TF Serving's REST API writes non-finite floats as the bare tokens NaN,
// Infinity and -Infinity (tensorflow_serving/util/json_tensor.cc,
// WriteDecimal), with one output or several, in either format.
TEST(RestCodec, NonFiniteOutputsAreWrittenAsTfServingWritesThem) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  at::Tensor p = at::tensor({nan, -inf, 1.5f, inf}).reshape({2, 2});
  EXPECT_EQ(predict_response_text({{"p", p}}, true), R"({"predictions":[[NaN,-Infinity],[1.5,Infinity]]})");
  EXPECT_EQ(predict_response_text({{"p", p}}, false), R"({"outputs":[[NaN,-Infinity],[1.5,Infinity]]})");
  at::Tensor a = at::tensor({1, 2}, at::kLong);
  at::Tensor b = at::tensor({std::numeric_limits<double>::quiet_NaN(), 0.5}, at::kDouble).reshape({2, 1});
  EXPECT_EQ(predict_response_text({{"a", a}, {"b", b}}, true),
            R"({"predictions":[{"a":1,"b":[NaN]},{"a":2,"b":[0.5]}]})");
  EXPECT_EQ(predict_response_text({{"a", a}, {"b", b}}, false), R"({"outputs":{"a":[1,2],"b":[[NaN],[0.5]]}})");
  // The DOM form stays JSON: its dump() writes null.
  EXPECT_EQ(encode_predict_response({{"p", p}}, true).dump(), R"({"predictions":[[null,null],[1.5,null]]})");
}

// The request side accepts what rapidjson's kParseNanAndInfFlag accepts (TF
// Serving's parser): NaN, Inf, Infinity, each optionally with '-'.
TEST(RestCodec, RequestsAcceptTfServingsNonFiniteTokens) {
  Json j = parse_request_json(R"({"v": [NaN, -NaN, Inf, -Inf, Infinity, -Infinity, -1], "s": "Inf NaN"})", 64);
  EXPECT_EQ(j["v"], Json::parse(R"(["NaN", "NaN", "Infinity", "-Infinity", "Infinity", "-Infinity", -1])"));
  EXPECT_EQ(j["s"], "Inf NaN");
  at::Tensor t = json_to_tensor(j["v"], at::kFloat, "input 'x'");
  EXPECT_TRUE(std::isnan(t[0].item<float>()) && std::isnan(t[1].item<float>()));
  EXPECT_EQ(t[2].item<float>(), std::numeric_limits<float>::infinity());
  EXPECT_EQ(t[3].item<float>(), -std::numeric_limits<float>::infinity());
  for (const char* bad : {R"({"v": [Infx]})", R"({"v": [Infinit]})", R"({"v": [nan]})", R"({"v": [+Inf]})"})
    EXPECT_THROW(parse_request_json(bad, 64), ServingError) << bad;
}

// Open Inference Protocol bodies: "parameters" must be objects, and the
// binary tensor data extension is refused by name (kiln answers JSON data,
// which a client that asked for binary would misread); "id" is a string and
// "outputs" a list of {"name"} objects, as the protocol defines them.
std::string kserve_error(const std::string& body) {
  try {
    decode_kserve_infer(parse_request_json(body, 64));
  } catch (const ServingError& e) {
    return e.what();
  }
  return "";
}

TEST(RestCodec, KServeInferFollowsTheProtocolsShapes) {
  const std::string x = R"({"name": "x", "shape": [1], "datatype": "FP32", "data": [1]})";
  EXPECT_EQ(kserve_error(R"({"id": "r", "parameters": {"priority": 1}, "inputs": [)" + x +
                         R"(], "outputs": [{"name": "p", "parameters": {"binary_data": false}}]})"),
            "");
  EXPECT_EQ(decode_kserve_infer(parse_request_json(R"({"id": "r", "inputs": [)" + x + "]}", 64)).id, Json("r"));
  EXPECT_EQ(kserve_error(R"({"id": 7, "inputs": [)" + x + "]}"), "\"id\" must be a string");
  EXPECT_EQ(kserve_error(R"({"parameters": [], "inputs": [)" + x + "]}"),
            "the infer request: \"parameters\" must be an object");
  EXPECT_EQ(kserve_error(R"({"inputs": [)" + x + R"(], "outputs": "p"})"),
            "\"outputs\" must be a list of {\"name\": ...} objects");
  EXPECT_EQ(kserve_error(R"({"inputs": [)" + x + R"(], "outputs": [{"nam": "p"}]})"),
            "each entry of \"outputs\" must be an object with a string \"name\"");
  EXPECT_NE(
      kserve_error(R"({"inputs": [)" + x + R"(], "outputs": [{"name": "p", "parameters": {"binary_data": true}}]})")
          .find("output \"p\": parameter \"binary_data\" asks for the binary tensor data extension"),
      std::string::npos);
  EXPECT_NE(kserve_error(R"({"parameters": {"binary_data_output": true}, "inputs": [)" + x + "]}")
                .find("parameter \"binary_data_output\""),
            std::string::npos);
  EXPECT_NE(
      kserve_error(
          R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "parameters": {"binary_data_size": 4}}]})")
          .find("input \"x\": parameter \"binary_data_size\""),
      std::string::npos);
  EXPECT_NE(
      kserve_error(R"({"inputs": [)" + x + R"(], "outputs": [{"name": "p", "parameters": {"classification": 3}}]})")
          .find("\"classification\" (the classification extension) is not supported"),
      std::string::npos);
}

}  // namespace
}  // namespace kiln::serving
