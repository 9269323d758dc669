#include "kiln/data/readers.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>

#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/testing/expect_error.h"
#include "kiln/testing/testing.h"

namespace kiln::data {
namespace {

using ::testing::HasSubstr;

std::string write(const TempDir& dir, const std::string& name, const std::string& bytes) {
  const std::string path = join_path(dir.path(), name);
  atomic_write_file(path, bytes);
  return path;
}

std::string write_gz(const TempDir& dir, const std::string& name, const std::string& bytes) {
  const std::string path = join_path(dir.path(), name);
  gzFile f = gzopen(path.c_str(), "wb");
  EXPECT_TRUE(f != nullptr);
  EXPECT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  gzclose(f);
  return path;
}

// IDX bytes: magic 0x0000<type><ndim>, big-endian dims, then `data`.
std::string idx_bytes(uint8_t type, const std::vector<uint32_t>& dims, const std::string& data) {
  std::string s = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) s += static_cast<char>((d >> shift) & 0xff);
  }
  return s + data;
}

std::string counting_bytes(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i * 7 % 251);
  return s;
}

// ------------------------------------------------------------------- IDX

TEST(ReadersTest, IdxPlainAndGzipGiveTheSameUint8Tensor) {
  TempDir dir;
  const std::string bytes = idx_bytes(0x08, {3, 2, 4}, counting_bytes(24));
  for (const std::string& path : {write(dir, "x-idx3-ubyte", bytes), write_gz(dir, "x-idx3-ubyte.gz", bytes)}) {
    at::Tensor t = read_idx(path);
    EXPECT_EQ(t.scalar_type(), at::kByte);
    EXPECT_EQ(t.sizes(), (std::vector<int64_t>{3, 2, 4}));
    for (int64_t i = 0; i < 24; ++i) EXPECT_EQ(t.reshape({-1})[i].item<int>(), i * 7 % 251);
  }
}

TEST(ReadersTest, IdxMultiByteTypesAreBigEndian) {
  TempDir dir;
  // int32 [1, -2, 65536]
  std::string data = {0, 0, 0, 1, '\xff', '\xff', '\xff', '\xfe', 0, 1, 0, 0};
  at::Tensor t = read_idx(write(dir, "i.idx", idx_bytes(0x0C, {3}, data)));
  EXPECT_EQ(t.scalar_type(), at::kInt);
  EXPECT_EQ(t[0].item<int>(), 1);
  EXPECT_EQ(t[1].item<int>(), -2);
  EXPECT_EQ(t[2].item<int>(), 65536);
  // float32 1.5 = 0x3FC00000
  at::Tensor f = read_idx(write(dir, "f.idx", idx_bytes(0x0D, {1}, std::string{0x3f, '\xc0', 0, 0})));
  EXPECT_EQ(f.scalar_type(), at::kFloat);
  EXPECT_EQ(f[0].item<float>(), 1.5f);
}

TEST(ReadersTest, IdxValidatesMagicDimsAndLength) {
  TempDir dir;
  auto bad_magic = write(dir, "bad-magic", std::string{1, 2, 8, 1, 0, 0, 0, 1, 5});
  EXPECT_THAT(error_of<FormatError>([&] { read_idx(bad_magic); }),
              ::testing::AllOf(HasSubstr(bad_magic), HasSubstr("magic")));
  auto bad_type = write(dir, "bad-type", idx_bytes(0x07, {1}, "x"));
  EXPECT_THAT(error_of<FormatError>([&] { read_idx(bad_type); }), HasSubstr("data type"));
  auto no_dims = write(dir, "no-dims", idx_bytes(0x08, {}, ""));
  EXPECT_THAT(error_of<FormatError>([&] { read_idx(no_dims); }), HasSubstr("0 dimensions"));
  auto short_dims = write(dir, "short-dims", std::string{0, 0, 8, 3, 0, 0, 0, 2});
  EXPECT_THAT(error_of<FormatError>([&] { read_idx(short_dims); }), HasSubstr("truncated header"));
  auto truncated = write_gz(dir, "truncated.gz", idx_bytes(0x08, {10, 10}, counting_bytes(99)));
  EXPECT_THAT(error_of<FormatError>([&] { read_idx(truncated); }),
              ::testing::AllOf(HasSubstr(truncated), HasSubstr("truncated"), HasSubstr("100"), HasSubstr("99")));
  auto extra = write(dir, "extra", idx_bytes(0x08, {2}, "abc"));
  EXPECT_THAT(error_of<FormatError>([&] { read_idx(extra); }), HasSubstr("extra bytes"));
  auto tiny = write(dir, "tiny", std::string{0, 0});
  EXPECT_THAT(error_of<FormatError>([&] { read_idx(tiny); }), HasSubstr("truncated header"));
  EXPECT_THROW(read_idx(join_path(dir.path(), "missing.gz")), NotFoundError);
}

TEST(ReadersTest, IdxCorruptGzipStreamIsAFormatError) {
  TempDir dir;
  auto path = write_gz(dir, "x.gz", idx_bytes(0x08, {4000}, counting_bytes(4000)));
  std::string gz = read_file(path);
  // Cut the compressed stream in the middle.
  auto cut = write(dir, "cut.gz", gz.substr(0, gz.size() / 2));
  EXPECT_THAT(error_of<FormatError>([&] { read_idx(cut); }), HasSubstr(cut));
}

// -------------------------------------------------------------------- CSV

TEST(ReadersTest, CsvReadsFeaturesAndIntLabels) {
  TempDir dir;
  auto path = write(dir, "t.csv",
                    "a, b ,label,c\r\n"
                    "1,2.5,0,-3\r\n"
                    "\n"
                    "4e1,\"5\",2, 6 \n"
                    "7,8,1.0,nan\n");
  CsvOptions opts;
  opts.label_column = "label";
  opts.allow_non_finite = true;  // nan parses when asked for (refused by default: below)
  auto d = read_csv(path, opts);
  EXPECT_EQ(d.feature_names, (std::vector<std::string>{"a", "b", "c"}));
  ASSERT_EQ(d.features.sizes(), (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(d.features.scalar_type(), at::kFloat);
  EXPECT_EQ(d.features[0][1].item<float>(), 2.5f);
  EXPECT_EQ(d.features[0][2].item<float>(), -3.f);
  EXPECT_EQ(d.features[1][0].item<float>(), 40.f);
  EXPECT_EQ(d.features[1][1].item<float>(), 5.f);
  EXPECT_TRUE(std::isnan(d.features[2][2].item<float>()));
  EXPECT_EQ(d.labels.scalar_type(), at::kLong);
  EXPECT_TRUE(d.labels.equal(at::tensor(std::vector<int64_t>{0, 2, 1})));
  EXPECT_EQ(d.tensors().size(), 2u);
  auto batches = Dataset::from_tensor_slices(d.tensors()).batch(2).iterator();
  EXPECT_EQ((*batches->next())[0].sizes(), (std::vector<int64_t>{2, 3}));
}

TEST(ReadersTest, CsvFloatLabelsSelectedColumnsAndQuotes) {
  TempDir dir;
  auto path = write(dir, "t.csv",
                    "name;x;y;target\n"
                    "\"Smith; \"\"J\"\"\";1;2;0.25\n"
                    "plain;3;4;-1.5\n");
  CsvOptions opts;
  opts.label_column = "target";
  opts.label_type = LabelType::kFloat32;
  opts.feature_columns = {"y", "x"};  // "name" is text: left out
  opts.delimiter = ';';
  auto d = read_csv(path, opts);
  EXPECT_EQ(d.feature_names, (std::vector<std::string>{"y", "x"}));
  EXPECT_TRUE(d.features.equal(at::tensor({2.f, 1.f, 4.f, 3.f}).reshape({2, 2})));
  EXPECT_EQ(d.labels.scalar_type(), at::kFloat);
  EXPECT_TRUE(d.labels.equal(at::tensor({0.25f, -1.5f})));
  // No label column: features only.
  auto plain = write(dir, "p.csv", "u,v\n1,2\n");
  auto f = read_csv(plain);
  EXPECT_FALSE(f.labels.defined());
  // Header only: empty tensors of the right widths.
  auto header_only = read_csv(write(dir, "h.csv", "x;y;target\n"), [] {
    CsvOptions o;
    o.label_column = "target";
    o.delimiter = ';';
    return o;
  }());
  EXPECT_EQ(header_only.features.sizes(), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(header_only.labels.sizes(), (std::vector<int64_t>{0}));
  EXPECT_EQ(header_only.labels.scalar_type(), at::kLong);
  EXPECT_EQ(f.tensors().size(), 1u);
  EXPECT_EQ(f.features.sizes(), (std::vector<int64_t>{1, 2}));
}

TEST(ReadersTest, CsvErrorsNameFileLineAndColumn) {
  TempDir dir;
  CsvOptions opts;
  opts.label_column = "y";
  auto bad_value = write(dir, "v.csv", "x,y\n1,0\n\n2x,1\n");
  EXPECT_THAT(error_of<FormatError>([&] { read_csv(bad_value, opts); }),
              ::testing::AllOf(HasSubstr(bad_value + ":4"), HasSubstr("'x'"), HasSubstr("'2x'")));
  auto wrong_count = write(dir, "c.csv", "x,y\n1,0\n1,2,3\n");
  EXPECT_THAT(error_of<FormatError>([&] { read_csv(wrong_count, opts); }),
              ::testing::AllOf(HasSubstr(wrong_count + ":3"), HasSubstr("expected 2 columns"), HasSubstr("found 3")));
  auto empty_value = write(dir, "e.csv", "x,y\n,0\n");
  EXPECT_THAT(error_of<FormatError>([&] { read_csv(empty_value, opts); }),
              ::testing::AllOf(HasSubstr(empty_value + ":2"), HasSubstr("empty value")));
  auto float_label = write(dir, "l.csv", "x,y\n1,0.5\n");
  EXPECT_THAT(error_of<FormatError>([&] { read_csv(float_label, opts); }),
              ::testing::AllOf(HasSubstr(float_label + ":2"), HasSubstr("integer")));
  auto unterminated = write(dir, "q.csv", "x,y\n\"1,0\n");
  EXPECT_THAT(error_of<FormatError>([&] { read_csv(unterminated, opts); }), HasSubstr("unterminated"));
  CsvOptions missing;
  missing.label_column = "label";
  EXPECT_THAT(error_of<ValueError>([&] { read_csv(bad_value, missing); }),
              ::testing::AllOf(HasSubstr("'label'"), HasSubstr("x, y")));
  EXPECT_THROW(read_csv(write(dir, "empty.csv", "\n\n")), FormatError);
  EXPECT_THROW(read_csv(join_path(dir.path(), "missing.csv")), NotFoundError);
}

// Regression: NaN/inf features trained silently to a model of NaN weights.
TEST(ReadersTest, NonFiniteValuesAreRefusedByDefaultNamingFileRowAndColumn) {
  TempDir dir;
  CsvOptions opts;
  opts.label_column = "y";
  for (const char* bad : {"nan", "NaN", "inf", "-inf", "1e39"}) {  // 1e39 overflows float32
    auto path = write(dir, "n.csv", std::string("a,b,y\n1,2,0\n3,") + bad + ",1\n");
    EXPECT_THAT(error_of<FormatError>([&] { read_csv(path, opts); }),
                ::testing::AllOf(HasSubstr(path + ":3"), HasSubstr("row 2"), HasSubstr("column 'b'"),
                                 HasSubstr("allow_non_finite")))
        << bad;
    CsvOptions allow = opts;
    allow.allow_non_finite = true;
    EXPECT_FALSE(std::isfinite(read_csv(path, allow).features[1][1].item<float>())) << bad;
  }
  opts.label_type = LabelType::kFloat32;
  auto label = write(dir, "l.csv", "a,y\n1,nan\n");
  EXPECT_THAT(error_of<FormatError>([&] { read_csv(label, opts); }),
              ::testing::AllOf(HasSubstr(label + ":2"), HasSubstr("label 'y'")));

  JsonlOptions j;
  j.feature_keys = {"x", "z"};
  j.label_key = "y";
  auto jsonl = write(dir, "n.jsonl", "{\"x\": [1, 2], \"z\": 1, \"y\": 0}\n{\"x\": [1, 1e39], \"z\": 1, \"y\": 0}\n");
  EXPECT_THAT(error_of<FormatError>([&] { read_jsonl(jsonl, j); }),
              ::testing::AllOf(HasSubstr(jsonl + ":2"), HasSubstr("row 2"), HasSubstr("'x[1]'"), HasSubstr("inf")));
  j.allow_non_finite = true;
  EXPECT_TRUE(std::isinf(read_jsonl(jsonl, j).features[1][1].item<float>()));
  // Beyond double's range the JSON itself is refused, naming the line.
  auto overflow = write(dir, "o.jsonl", "{\"x\": [1, 1e999], \"z\": 1, \"y\": 0}\n");
  EXPECT_THAT(error_of<FormatError>([&] { read_jsonl(overflow, j); }),
              ::testing::AllOf(HasSubstr(overflow + ":1"), HasSubstr("1e999")));

  // Arrays read whole (npy, IDX): the first bad element's row and column.
  auto x = at::zeros({3, 2, 2});
  x[2][1][0] = std::nanf("");
  EXPECT_THAT(error_of<FormatError>([&] { check_finite_features(x, "x.npy"); }),
              ::testing::AllOf(HasSubstr("x.npy"), HasSubstr("row 2, column 2"), HasSubstr("nan")));
  check_finite_features(at::ones({3, 2}), "fine.npy");
  check_finite_features(at::ones({3, 2}, at::kLong), "ints.npy");
}

// ------------------------------------------------------------ JSON Lines

TEST(ReadersTest, JsonlReadsFeaturesAndLabels) {
  TempDir dir;
  auto path = write(dir, "t.jsonl",
                    "{\"x\": [1, 2], \"z\": 3.5, \"label\": 1, \"note\": \"ignored\"}\n"
                    "\n"
                    "{\"label\": 0, \"z\": true, \"x\": [[4], [5]]}\n");
  JsonlOptions opts;
  opts.feature_keys = {"x", "z"};
  opts.label_key = "label";
  auto d = read_jsonl(path, opts);
  EXPECT_EQ(d.feature_names, (std::vector<std::string>{"x[0]", "x[1]", "z"}));
  EXPECT_TRUE(d.features.equal(at::tensor({1.f, 2.f, 3.5f, 4.f, 5.f, 1.f}).reshape({2, 3})));
  EXPECT_TRUE(d.labels.equal(at::tensor(std::vector<int64_t>{1, 0})));
  opts.label_type = LabelType::kFloat32;
  EXPECT_EQ(read_jsonl(path, opts).labels.scalar_type(), at::kFloat);
}

TEST(ReadersTest, JsonlErrorsNameFileAndLine) {
  TempDir dir;
  JsonlOptions opts;
  opts.feature_keys = {"x"};
  opts.label_key = "y";
  auto missing = write(dir, "m.jsonl", "{\"x\": 1, \"y\": 0}\n{\"x\": 2}\n");
  EXPECT_THAT(error_of<FormatError>([&] { read_jsonl(missing, opts); }),
              ::testing::AllOf(HasSubstr(missing + ":2"), HasSubstr("'y'")));
  auto width = write(dir, "w.jsonl", "{\"x\": [1, 2], \"y\": 0}\n{\"x\": [1], \"y\": 0}\n");
  EXPECT_THAT(error_of<FormatError>([&] { read_jsonl(width, opts); }),
              ::testing::AllOf(HasSubstr(width + ":2"), HasSubstr("1 values")));
  auto syntax = write(dir, "s.jsonl", "{\"x\": 1, \"y\": 0}\n{\"x\": 1,,}\n");
  EXPECT_THAT(error_of<FormatError>([&] { read_jsonl(syntax, opts); }), HasSubstr(syntax + ":2"));
  auto text = write(dir, "t.jsonl", "{\"x\": \"one\", \"y\": 0}\n");
  EXPECT_THAT(error_of<FormatError>([&] { read_jsonl(text, opts); }), HasSubstr("\"one\""));
  auto not_object = write(dir, "a.jsonl", "[1, 2]\n");
  EXPECT_THAT(error_of<FormatError>([&] { read_jsonl(not_object, opts); }), HasSubstr("object"));
  auto float_label = write(dir, "f.jsonl", "{\"x\": 1, \"y\": 0.5}\n");
  EXPECT_THAT(error_of<FormatError>([&] { read_jsonl(float_label, opts); }), HasSubstr("integer"));
  EXPECT_THROW(read_jsonl(missing, JsonlOptions{}), ValueError);
}

// -------------------------------------------------------------------- NPY

// A version 1.0 .npy: magic, header padded so the data starts at a multiple
// of 64, as numpy writes it.
std::string npy_bytes(const std::string& dict, const std::string& data, int major = 1) {
  const size_t prefix = major == 1 ? 10 : 12;
  std::string header = dict;
  while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string s = std::string("\x93NUMPY", 6) + static_cast<char>(major) + '\0';
  const size_t n = header.size();
  s += static_cast<char>(n & 0xff);
  s += static_cast<char>((n >> 8) & 0xff);
  if (major != 1) s += std::string(2, '\0');
  return s + header + data;
}

template <class T>
std::string raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

TEST(ReadersTest, NpyHandWrittenHeaders) {
  TempDir dir;
  auto f4 = write(dir, "f4.npy",
                  npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
                            raw(std::vector<float>{0, 1, 2, 3, 4, 5})));
  at::Tensor t = read_npy(f4);
  EXPECT_EQ(t.scalar_type(), at::kFloat);
  EXPECT_TRUE(t.equal(at::arange(6, at::kFloat).reshape({2, 3})));
  auto i8 = write(dir, "i8.npy",
                  npy_bytes("{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }",
                            raw(std::vector<int64_t>{-1, 0, 1LL << 40}), 2));
  t = read_npy(i8);
  EXPECT_EQ(t.scalar_type(), at::kLong);
  EXPECT_EQ(t[2].item<int64_t>(), 1LL << 40);
  auto b1 = write(dir, "b1.npy",
                  npy_bytes("{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }", std::string{1, 0, 1}));
  t = read_npy(b1);
  EXPECT_EQ(t.scalar_type(), at::kBool);
  EXPECT_TRUE(t.equal(at::tensor({1, 0, 1}, at::kByte).to(at::kBool)));
  // Plugs into a dataset.
  auto ds = Dataset::from_tensor_slices({read_npy(f4)}).batch(2).iterator();
  EXPECT_EQ((*ds->next())[0].sizes(), (std::vector<int64_t>{2, 3}));
}

TEST(ReadersTest, NpyRejectsWhatItCannotRead) {
  TempDir dir;
  auto header = [](const std::string& descr, const std::string& order, const std::string& shape) {
    return "{'descr': '" + descr + "', 'fortran_order': " + order + ", 'shape': " + shape + ", }";
  };
  struct Case {
    std::string name, bytes, expect;
  };
  const std::vector<Case> cases = {
      {"big.npy", npy_bytes(header(">f4", "False", "(1,)"), std::string(4, '\0')), "big-endian"},
      {"complex.npy", npy_bytes(header("<c8", "False", "(1,)"), std::string(8, '\0')), "unsupported dtype"},
      {"fortran.npy", npy_bytes(header("<f4", "True", "(2, 2)"), std::string(16, '\0')), "Fortran"},
      {"short.npy", npy_bytes(header("<f4", "False", "(2, 2)"), std::string(15, '\0')), "truncated"},
      {"long.npy", npy_bytes(header("<f4", "False", "(2, 2)"), std::string(17, '\0')), "extra bytes"},
      {"shape.npy", npy_bytes(header("<f4", "False", "(2, x)"), std::string(8, '\0')), "bad dimension"},
      {"magic.npy", std::string("\x93NUMPX\x01\x00\x00\x00", 10), "magic"},
      {"version.npy", npy_bytes(header("<f4", "False", "(1,)"), std::string(4, '\0'), 4), "version"},
  };
  for (const auto& c : cases) {
    auto path = write(dir, c.name, c.bytes);
    EXPECT_THAT(error_of<FormatError>([&] { read_npy(path); }), ::testing::AllOf(HasSubstr(path), HasSubstr(c.expect)))
        << c.name;
  }
  EXPECT_THROW(read_npy(join_path(dir.path(), "missing.npy")), NotFoundError);
}

TEST(ReadersTest, NpyFixturesWrittenByNumpy) {
  // kiln/data/testdata/make_npy_fixtures.py wrote these with numpy.save.
  auto fixture = [](const std::string& name) { return source_path("kiln/data/testdata/" + name); };
  at::Tensor f8 = read_npy(fixture("f8_2x3.npy"));
  EXPECT_EQ(f8.scalar_type(), at::kDouble);
  EXPECT_TRUE(f8.equal(at::tensor({0.5, 1.5, 2.5, 10.5, 11.5, 12.5}, at::kDouble).reshape({2, 3})));
  at::Tensor i4 = read_npy(fixture("i4_5.npy"));
  EXPECT_EQ(i4.scalar_type(), at::kInt);
  EXPECT_TRUE(i4.equal(at::tensor({0, -1, 2, -3, 4}, at::kInt)));
  at::Tensor u1 = read_npy(fixture("u1_2x3x4.npy"));
  EXPECT_EQ(u1.scalar_type(), at::kByte);
  EXPECT_TRUE(u1.equal(at::arange(24, at::kByte).reshape({2, 3, 4})));
  at::Tensor b1 = read_npy(fixture("b1_4.npy"));
  EXPECT_TRUE(b1.equal(at::tensor({1, 0, 1, 0}, at::kByte).to(at::kBool)));
  at::Tensor scalar = read_npy(fixture("i8_scalar.npy"));
  EXPECT_EQ(scalar.dim(), 0);
  EXPECT_EQ(scalar.item<int64_t>(), -7);
  at::Tensor v2 = read_npy(fixture("f4_v2_3x2.npy"));
  EXPECT_EQ(v2.scalar_type(), at::kFloat);
  EXPECT_TRUE(v2.equal((at::arange(6, at::kFloat) * 0.25).reshape({3, 2})));
  EXPECT_THROW(read_npy(fixture("f4_big_endian.npy")), FormatError);
  EXPECT_THROW(read_npy(fixture("f8_fortran.npy")), FormatError);
}

}  // namespace
}  // namespace kiln::data
