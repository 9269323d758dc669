#include <gtest/gtest.h>

#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/core/json.h"
#include "kiln/saving/safetensors.h"
#include "kiln/testing/testing.h"

namespace kiln {
namespace {

TEST(Safetensors, RoundTripsEveryDtypeBitExactly) {
  TempDir dir;
  NamedTensors in = {
      {"a/kernel", at::randn({3, 4})},
      {"b", at::randn({2}, at::kDouble)},
      {"c", at::randn({5}).to(at::kBFloat16)},
      {"d", at::randn({2, 2}).to(at::kHalf)},
      {"e", at::arange(6, at::kLong).reshape({2, 3})},
      {"f", at::tensor({true, false})},
      {"g", at::zeros({0, 3})},
      {"h", at::randn({4, 4}).t()},  // non-contiguous input
  };
  save_safetensors(dir.path() + "/w.safetensors", in, {{"format", "kiln"}});
  std::map<std::string, std::string> meta;
  auto out = load_safetensors(dir.path() + "/w.safetensors", &meta);
  ASSERT_EQ(out.size(), in.size());
  EXPECT_EQ(meta["format"], "kiln");
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(out[i].first, in[i].first);
    EXPECT_EQ(out[i].second.scalar_type(), in[i].second.scalar_type());
    EXPECT_TRUE(at::equal(out[i].second, in[i].second)) << in[i].first;
  }
}

TEST(Safetensors, HeaderFollowsTheFormat) {
  auto bytes = encode_safetensors({{"x", at::ones({2}, at::kFloat)}});
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= (uint64_t)(unsigned char)bytes[i] << (8 * i);
  EXPECT_EQ((8 + n) % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 8);
  auto header = Json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["x"]["dtype"], "F32");
  EXPECT_EQ(header["x"]["shape"], Json::array({2}));
  EXPECT_EQ(header["x"]["data_offsets"], Json::array({0, 8}));
}

TEST(Safetensors, EveryTruncationIsAFormatErrorNeverACrash) {
  auto bytes = encode_safetensors({{"x", at::randn({8})}, {"y", at::randn({3, 3})}});
  for (size_t len = 0; len < bytes.size(); ++len) {
    try {
      decode_safetensors(bytes.substr(0, len), "w.safetensors");
      ADD_FAILURE() << "truncation to " << len << " bytes was accepted";
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find("w.safetensors"), std::string::npos);
    }
  }
}

TEST(Safetensors, CorruptHeadersAreRejected) {
  auto good = encode_safetensors({{"x", at::randn({4})}});
  std::string huge = good;
  huge[7] = (char)0x7f;  // absurd header length
  EXPECT_THROW(decode_safetensors(huge, "f"), FormatError);
  std::string not_json = good;
  not_json[9] = '#';
  EXPECT_THROW(decode_safetensors(not_json, "f"), FormatError);
  // Shape that does not match the byte range.
  std::string h = R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})";
  std::string bad(8, '\0');
  bad[0] = (char)h.size();
  bad += h + std::string(16, '\0');
  EXPECT_THROW(decode_safetensors(bad, "f"), FormatError);
  // Overlapping ranges.
  h = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  bad = std::string(8, '\0');
  bad[0] = (char)h.size();
  bad += h + std::string(12, '\0');
  EXPECT_THROW(decode_safetensors(bad, "f"), FormatError);
  EXPECT_THROW(encode_safetensors({{"x", at::ones({1})}, {"x", at::ones({1})}}), ValueError);
}

TEST(Safetensors, MissingFileIsNotFound) {
  EXPECT_THROW(load_safetensors("/nonexistent/w.safetensors"), NotFoundError);
}

}  // namespace
}  // namespace kiln
