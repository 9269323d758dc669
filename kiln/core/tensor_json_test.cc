#include "kiln/core/tensor_json.h"

#include <gtest/gtest.h>

#include <limits>

#include "kiln/core/base64.h"
#include "kiln/core/error.h"
#include "kiln/core/json_limits.h"
#include "kiln/core/string_tensor.h"
#include "kiln/testing/expect_error.h"

namespace kiln {
namespace {

std::string text_of(const at::Tensor& t) {
  std::string s;
  append_tensor_json(s, t);
  return s;
}

std::string numbers_error(const Json& v, const std::string& what = "input 'x'") {
  return error_of<ValueError>([&] { json_to_numbers(v, what); });
}

TEST(TensorJson, ReadsShapeAndValues) {
  NestedNumbers n = json_to_numbers(Json::parse("[[1, 2.5, true], [3, 4, false]]"), "x");
  EXPECT_EQ(n.shape, (Shape{2, 3}));
  EXPECT_EQ(n.values, (std::vector<double>{1, 2.5, 1, 3, 4, 0}));
  NestedNumbers scalar = json_to_numbers(Json(7), "x");
  EXPECT_TRUE(scalar.shape.empty());
  EXPECT_EQ(scalar.values, (std::vector<double>{7}));
  NestedNumbers empty = json_to_numbers(Json::parse("[[], []]"), "x");
  EXPECT_EQ(empty.shape, (Shape{2, 0}));
  EXPECT_TRUE(empty.values.empty());
}

TEST(TensorJson, ErrorsNameThePathOfTheBadElement) {
  EXPECT_EQ(numbers_error(Json::parse(R"([[1, "a"], [3, 4]])")),
            R"(input 'x' holds "a" at [0][1] where a number belongs)");
  EXPECT_EQ(numbers_error(Json::parse("[[1, 2], [3]]")),
            "input 'x' is a ragged list: every list at depth 1 must have 2 entries; [1] has 1");
  EXPECT_EQ(numbers_error(Json::parse("[[1], 2]")),
            "input 'x' is a ragged list: every list at depth 1 must have 1 entries; [1] is not a list");
  EXPECT_EQ(numbers_error(Json::parse("[1, [2]]")), "input 'x' holds [2] at [1] where a number belongs");
  EXPECT_EQ(numbers_error(Json("NaN")), R"(input 'x' holds "NaN" where a number belongs)");
  EXPECT_EQ(numbers_error(Json(nullptr)), "input 'x' holds null where a number belongs");
}

TEST(TensorJson, ReadsStringsAndB64AndWritesThemBack) {
  NestedStrings n = json_to_strings(Json::parse(R"([["a", {"b64": "AGI="}], ["", "naïve"]])"), "x");
  EXPECT_EQ(n.shape, (Shape{2, 2}));
  EXPECT_EQ(n.values, (std::vector<std::string>{"a", std::string("\0b", 2), "", "naïve"}));
  EXPECT_TRUE(json_to_strings(Json("one"), "x").shape.empty());
  at::Tensor t = json_to_string_tensor(Json::parse(R"([["x", "yz"]])"), "x");
  EXPECT_EQ(strings::logical_shape(t), (Shape{1, 2}));
  EXPECT_EQ(string_tensor_to_json(t), Json::parse(R"([["x", "yz"]])"));
  EXPECT_EQ(string_tensor_to_json(strings::encode({"s"}, {})), Json("s"));

  auto strings_error = [](const Json& v, bool b64 = true) {
    return error_of<ValueError>([&] { json_to_strings(v, "input 'text'", b64); });
  };
  EXPECT_EQ(strings_error(Json::parse(R"(["a", 3])")), "input 'text' expects dtype string. Received: 3 at [1]");
  EXPECT_EQ(strings_error(Json::parse(R"([{"b64": "!!!!"}])")),
            "input 'text' at [0]: invalid base64: unexpected character at offset 0");
  EXPECT_EQ(strings_error(Json::parse(R"({"b64": "AA=="})"), false),
            R"(input 'text' expects dtype string. Received: {"b64":"AA=="})");
  EXPECT_EQ(strings_error(Json::parse(R"([["a"], "b"])")),
            "input 'text' is a ragged list: every list at depth 1 must have 1 entries; [1] is not a list");
  EXPECT_EQ(error_of<ValueError>([] { refuse_strings(Json::parse(R"([["abc", 1]])"), at::kFloat, "input 'x'"); }),
            R"(input 'x' expects dtype float32. Received: string ("abc"))");
  EXPECT_NO_THROW(refuse_strings(Json::parse("[1, 2]"), at::kFloat, "x"));
  EXPECT_NO_THROW(refuse_strings(Json("NaN"), at::kFloat, "x", {.special_float_strings = true}));
}

TEST(Base64, DecodesStrictly) {
  EXPECT_EQ(base64_decode("aGVsbG8="), "hello");
  for (const std::string& bytes :
       {std::string(), std::string("h"), std::string("he"), std::string("hel"), std::string("\0\xff\x10hello", 8)})
    EXPECT_EQ(base64_decode(base64_encode(bytes)), bytes);
  EXPECT_EQ(base64_encode("hello"), "aGVsbG8=");
  EXPECT_EQ(base64_encode("\xfb\xff"), "+/8=");
  EXPECT_EQ(base64_decode("aGVsbG8"), "hello");
  EXPECT_EQ(base64_decode("-_8="), "\xfb\xff");
  EXPECT_EQ(error_of<ValueError>([] { base64_decode("aGVs*G8="); }),
            "invalid base64: unexpected character at offset 4");
  EXPECT_EQ(error_of<ValueError>([] { base64_decode("a==="); }), "invalid base64: bad padding");
  EXPECT_EQ(error_of<ValueError>([] { base64_decode("a"); }), "invalid base64: truncated input");
}

TEST(TensorJson, SpecialFloatStringsOnRequest) {
  NestedNumbers n =
      json_to_numbers(Json::parse(R"(["NaN", "Infinity", "-Infinity"])"), "x", {.special_float_strings = true});
  ASSERT_EQ(n.values.size(), 3u);
  EXPECT_TRUE(std::isnan(n.values[0]));
  EXPECT_EQ(n.values[1], std::numeric_limits<double>::infinity());
  EXPECT_EQ(n.values[2], -std::numeric_limits<double>::infinity());
}

TEST(TensorJson, DepthIsBounded) {
  Json deep = Json(1);
  for (int i = 0; i < kMaxJsonDepth; ++i) deep = Json::array({deep});
  EXPECT_NO_THROW(json_to_numbers(deep, "x"));
  deep = Json::array({deep});
  EXPECT_NE(numbers_error(deep).find("nests lists more than"), std::string::npos) << numbers_error(deep);
}

TEST(TensorJson, ToTensorChecksIntegers) {
  at::Tensor t = json_to_tensor(Json::parse("[[1, 2], [3, 4]]"), at::kLong, "x");
  EXPECT_EQ(t.scalar_type(), at::kLong);
  EXPECT_EQ(t.sizes(), (at::IntArrayRef{2, 2}));
  EXPECT_EQ(t[1][0].item<int64_t>(), 3);
  try {
    json_to_tensor(Json::parse("[1.5]"), at::kInt, "input \"x\"");
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_EQ(std::string(e.what()), "input \"x\" expects integers (int32); received 1.500000");
  }
  at::Tensor f = json_to_tensor(Json::parse("[0.1]"), at::kFloat, "x");
  EXPECT_EQ(f[0].item<float>(), 0.1f);
}

TEST(TensorJson, WritesShortestNumbersPerDtype) {
  EXPECT_EQ(text_of(at::tensor({0.1f, 1.0f, -2.5f})), "[0.1,1,-2.5]");
  EXPECT_EQ(text_of(at::tensor({0.1}, at::kDouble)), "[0.1]");
  EXPECT_EQ(text_of(at::tensor({0.1f}).to(at::kDouble)), "[0.10000000149011612]");
  EXPECT_EQ(text_of(at::tensor({1, -2}, at::kInt)), "[1,-2]");
  EXPECT_EQ(text_of(at::tensor({1, 0}).to(at::kBool)), "[true,false]");
  EXPECT_EQ(text_of(at::tensor({0.5f}).to(at::kHalf)), "[0.5]");
  at::Tensor special = at::tensor({std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()});
  EXPECT_EQ(text_of(special), "[null,null]");
  std::string literals;
  append_tensor_json(literals, at::cat({special, -special}), {.non_finite_literals = true});
  EXPECT_EQ(literals, "[NaN,Infinity,NaN,-Infinity]");
  EXPECT_EQ(text_of(at::scalar_tensor(3.0f)), "3");
  EXPECT_EQ(text_of(at::zeros({2, 0})), "[[],[]]");
  EXPECT_EQ(text_of(at::arange(6, at::kLong).reshape({3, 2}).t()), "[[0,2,4],[1,3,5]]");  // not contiguous
}

TEST(TensorJson, DomDumpsTheSameText) {
  at::Tensor probs = at::rand({3, 4});
  probs[1][2] = std::numeric_limits<float>::quiet_NaN();
  for (const at::Tensor& t :
       {probs, at::rand({2, 2, 2}, at::kDouble), at::arange(4, at::kLong).reshape({2, 2}),
        at::tensor({1, 0}).to(at::kBool), at::rand({2}).to(at::kBFloat16), at::scalar_tensor(1.5)})
    EXPECT_EQ(tensor_to_json(t).dump(), text_of(t)) << t;
}

TEST(TensorJson, RoundTrip) {
  at::Tensor x = at::randn({2, 3, 4});
  at::Tensor back = json_to_tensor(Json::parse(text_of(x)), at::kFloat, "x");
  EXPECT_TRUE(at::equal(x, back));
}

}  // namespace
}  // namespace kiln
