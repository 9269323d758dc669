#include "kiln/core/string_tensor.h"

#include <gtest/gtest.h>

#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/testing/expect_error.h"

namespace kiln {
namespace {

TEST(StringTensor, RoundTripsAnyBytesWithLengthPrefixedRows) {
  const std::string with_nul("a\0b", 3);
  const std::vector<std::string> values = {"the cat", "", with_nul, "\xff\xfe"};
  at::Tensor t = strings::encode(values);
  EXPECT_EQ(t.scalar_type(), at::kByte);
  EXPECT_EQ(sizes_of(t), (Shape{4, 4 + 7}));
  EXPECT_EQ(t[0][0].item<int>(), 7);  // little-endian length
  EXPECT_EQ(t[2][4 + 1].item<int>(), 0);
  EXPECT_EQ(strings::decode(t), values);
  EXPECT_EQ(strings::logical_shape(t), (Shape{4}));
}

TEST(StringTensor, KeepsALogicalShapeAndSlicesByRow) {
  at::Tensor t = strings::encode({"a", "bb", "ccc", "dddd", "e", "f"}, {3, 2});
  EXPECT_EQ(strings::logical_shape(t), (Shape{3, 2}));
  EXPECT_EQ(strings::decode(t.index({1})), (std::vector<std::string>{"ccc", "dddd"}));
  EXPECT_EQ(strings::decode(t.index_select(0, at::tensor({2, 0}))), (std::vector<std::string>{"e", "f", "a", "bb"}));
}

TEST(StringTensor, ConcatAndStackPadToTheWidest) {
  at::Tensor a = strings::encode({"x"});
  at::Tensor b = strings::encode({"longer one", "yy"});
  at::Tensor c = strings::concat({a, b});
  EXPECT_EQ(sizes_of(c), (Shape{3, 4 + 10}));
  EXPECT_EQ(strings::decode(c), (std::vector<std::string>{"x", "longer one", "yy"}));
  auto widest = strings::pad_to_widest({a, b});
  EXPECT_EQ(widest[0].size(-1), widest[1].size(-1));
  EXPECT_EQ(strings::decode(widest[0]), (std::vector<std::string>{"x"}));
  at::Tensor s = strings::stack({strings::encode({"p", "q"}), strings::encode({"rrr", "s"})});
  EXPECT_EQ(strings::logical_shape(s), (Shape{2, 2}));
  EXPECT_EQ(strings::decode(s), (std::vector<std::string>{"p", "q", "rrr", "s"}));
}

TEST(StringTensor, RefusesWhatIsNotAStringTensor) {
  expect_error<ValueError>(
      [] {
        strings::decode(at::zeros({2, 3}), "input 'text'");
      },
      {"input 'text' is not a string tensor", "Float", "strings::encode"});
  at::Tensor bad = strings::encode({"ab"});
  bad[0][0] = 200;  // length beyond the row
  expect_error<ValueError>([&] { strings::decode(bad); }, {"claims 200 bytes", "holds 2"});
  expect_error<ValueError>([] { strings::encode({"a", "b", "c"}, {2, 2}); }, {"3 strings do not fill shape (2, 2)"});
}

TEST(StringTensor, DtypeNameIsString) {
  EXPECT_EQ(dtype_from_string("string"), kStringDType);
  EXPECT_EQ(dtype_to_string(kStringDType), "string");
  EXPECT_TRUE(is_string_dtype(dtype_from_string("string")));
  EXPECT_FALSE(is_string_dtype(at::kByte));
  EXPECT_THROW(DTypePolicy("string"), ValueError);
}

}  // namespace
}  // namespace kiln
