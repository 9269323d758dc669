#include "kiln/data/datasets.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <optional>
#include <set>
#include <string>

#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/core/string_tensor.h"
#include "kiln/data/adapt.h"
#include "kiln/data/dataset.h"
#include "kiln/testing/testing.h"

namespace kiln::datasets {
namespace {

using ::testing::HasSubstr;

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

bool fashion_mnist_installed() {
  const std::string dir = fashion_mnist_directory();
  return path_exists(join_path(dir, "train-images-idx3-ubyte.gz")) ||
         path_exists(join_path(dir, "train-images-idx3-ubyte"));
}

TEST(DatasetsTest, FashionMnistShapesAndLabels) {
  if (!fashion_mnist_installed()) {
    GTEST_SKIP() << "Fashion-MNIST files absent from " << fashion_mnist_directory()
                 << "; would check the real data's shapes, dtypes and labels "
                    "(apt-get install dataset-fashion-mnist)";
  }
  // Its speed is bench/fashion_mnist_load_bench's (docs/PERFORMANCE.md).
  auto d = fashion_mnist();
  EXPECT_EQ(d.x_train.sizes(), (std::vector<int64_t>{60000, 28, 28}));
  EXPECT_EQ(d.x_test.sizes(), (std::vector<int64_t>{10000, 28, 28}));
  EXPECT_EQ(d.x_train.scalar_type(), at::kByte);
  EXPECT_EQ(d.y_train.sizes(), (std::vector<int64_t>{60000}));
  EXPECT_EQ(d.y_test.sizes(), (std::vector<int64_t>{10000}));
  EXPECT_EQ(d.y_train.scalar_type(), at::kLong);
  // Balanced classes: 6,000 per class in train, 1,000 in test.
  EXPECT_TRUE(at::bincount(d.y_train).equal(at::full({10}, 6000, at::kLong)));
  EXPECT_TRUE(at::bincount(d.y_test).equal(at::full({10}, 1000, at::kLong)));
  EXPECT_EQ(d.x_train.max().item<int>(), 255);
  EXPECT_EQ(d.x_train.min().item<int>(), 0);
  // Known first labels of the train set: Ankle boot, T-shirt/top, T-shirt/top.
  EXPECT_EQ(d.y_train[0].item<int64_t>(), 9);
  EXPECT_EQ(d.y_train[1].item<int64_t>(), 0);
  EXPECT_EQ(fashion_mnist_class_names()[9], "Ankle boot");
  auto ds = data::Dataset::from_tensor_slices({d.x_train, d.y_train}).shuffle(60000, 1).batch(128);
  EXPECT_EQ(ds.cardinality(), 469);
  auto batch = ds.iterator()->next();
  EXPECT_EQ((*batch)[0].sizes(), (std::vector<int64_t>{128, 28, 28}));
}

std::string idx(uint8_t ndim, const std::vector<uint32_t>& dims, const std::string& data) {
  std::string s = {0, 0, 8, static_cast<char>(ndim)};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) s += static_cast<char>((d >> shift) & 0xff);
  }
  return s + data;
}

void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_TRUE(f != nullptr);
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

TEST(DatasetsTest, FashionMnistReadsTheDirectoryFromTheEnvironment) {
  TempDir dir;
  write_gz(join_path(dir.path(), "train-images-idx3-ubyte.gz"), idx(3, {3, 28, 28}, std::string(3 * 784, '\7')));
  write_gz(join_path(dir.path(), "train-labels-idx1-ubyte.gz"), idx(1, {3}, std::string{1, 2, 9}));
  // Plain (uncompressed) files are found too.
  atomic_write_file(join_path(dir.path(), "t10k-images-idx3-ubyte"), idx(3, {2, 28, 28}, std::string(2 * 784, 0)));
  atomic_write_file(join_path(dir.path(), "t10k-labels-idx1-ubyte"), idx(1, {2}, std::string{0, 5}));
  ScopedEnv env("KILN_FASHION_MNIST_DIR", dir.path());
  auto d = fashion_mnist();
  EXPECT_EQ(d.x_train.sizes(), (std::vector<int64_t>{3, 28, 28}));
  EXPECT_EQ(d.x_train[2][27][27].item<int>(), 7);
  EXPECT_TRUE(d.y_train.equal(at::tensor(std::vector<int64_t>{1, 2, 9})));
  EXPECT_TRUE(d.y_test.equal(at::tensor(std::vector<int64_t>{0, 5})));

  // Files that disagree are a FormatError.
  atomic_write_file(join_path(dir.path(), "t10k-labels-idx1-ubyte"), idx(1, {3}, std::string{0, 5, 1}));
  EXPECT_THAT([] { fashion_mnist(); }, ::testing::Throws<FormatError>());
  atomic_write_file(join_path(dir.path(), "t10k-labels-idx1-ubyte"), idx(1, {2}, std::string{0, 10}));
  EXPECT_THAT([] { fashion_mnist(); }, ::testing::Throws<FormatError>());
}

TEST(DatasetsTest, FashionMnistMissingFilesSayHowToInstallThem) {
  TempDir dir;
  ScopedEnv env("KILN_FASHION_MNIST_DIR", dir.path());
  try {
    fashion_mnist();
    FAIL() << "expected NotFoundError";
  } catch (const NotFoundError& e) {
    EXPECT_THAT(e.what(), HasSubstr(dir.path()));
    EXPECT_THAT(e.what(), HasSubstr("scripts/setup.sh"));
    EXPECT_THAT(e.what(), HasSubstr("apt-get install dataset-fashion-mnist"));
  }
}

// --- balanced_brackets: a generated sequence task ----------------------------------------

TEST(BalancedBrackets, LabelsMatchTheSequencesAndRepeatForASeed) {
  auto d = balanced_brackets(400, 100, 2, 12, 5);
  ASSERT_EQ(d.x_train.sizes(), (std::vector<int64_t>{400, 12}));
  ASSERT_EQ(d.x_test.sizes(), (std::vector<int64_t>{100, 12}));
  EXPECT_EQ(d.x_train.scalar_type(), at::kLong);
  EXPECT_EQ(d.y_train.sum().item<int64_t>(), 200);  // half balanced
  int64_t same_count_negatives = 0;
  for (int64_t i = 0; i < 400; ++i) {
    auto row = d.x_train[i];
    int64_t depth = 0, n = 0;
    bool ok = true, padding = false;
    for (int64_t t = 0; t < 12; ++t) {
      const int64_t tok = row[t].item<int64_t>();
      if (tok == 0) {
        padding = true;
        continue;
      }
      ASSERT_FALSE(padding) << "padding only at the end, row " << i;
      ASSERT_TRUE(tok == 1 || tok == 2);
      ++n;
      depth += tok == 1 ? 1 : -1;
      ok = ok && depth >= 0;
    }
    EXPECT_GE(n, 2);
    EXPECT_EQ(d.y_train[i].item<int64_t>(), ok && depth == 0 ? 1 : 0) << "row " << i;
    if (depth == 0 && !ok) ++same_count_negatives;
  }
  EXPECT_GT(same_count_negatives, 50);  // hard negatives: counts alone do not tell
  auto again = balanced_brackets(400, 100, 2, 12, 5);
  EXPECT_TRUE(at::equal(again.x_train, d.x_train));
  EXPECT_TRUE(at::equal(again.y_test, d.y_test));
  EXPECT_FALSE(at::equal(balanced_brackets(400, 100, 2, 12, 6).x_train, d.x_train));
}

TEST(BalancedBrackets, RejectsBadSizes) {
  EXPECT_THROW(balanced_brackets(0, 10, 2, 10, 1), ValueError);
  EXPECT_THROW(balanced_brackets(10, 10, 1, 10, 1), ValueError);
  EXPECT_THROW(balanced_brackets(10, 10, 5, 4, 1), ValueError);
}

TEST(TextTopics, RawSentencesOfFourTopicsRepeatForASeed) {
  auto d = text_topics(800, 200, 3);
  ASSERT_EQ(d.x_train.size(), 800u);
  ASSERT_EQ(d.x_test.size(), 200u);
  EXPECT_EQ(sizes_of(d.y_train), (Shape{800}));
  EXPECT_EQ(d.y_train.scalar_type(), at::kLong);
  for (int64_t k = 0; k < 4; ++k) EXPECT_GT((d.y_train == k).sum().item<int64_t>(), 150) << "topic " << k;
  EXPECT_EQ(text_topics_class_names().size(), 4u);
  size_t shortest = 1000, longest = 0;
  bool upper_word = false, comma = false, question = false;
  for (auto& t : d.x_train) {
    size_t words = 1 + std::count(t.begin(), t.end(), ' ');
    shortest = std::min(shortest, words);
    longest = std::max(longest, words);
    ASSERT_TRUE(std::isupper((unsigned char)t[0])) << t;
    comma |= t.find(',') != std::string::npos;
    question |= t.back() == '?';
    for (size_t i = 1; i + 1 < t.size(); ++i)
      upper_word |= t[i - 1] == ' ' && std::isupper((unsigned char)t[i]) && std::isupper((unsigned char)t[i + 1]);
  }
  EXPECT_EQ(shortest, 4u);
  EXPECT_EQ(longest, 16u);
  EXPECT_TRUE(upper_word && comma && question);
  auto again = text_topics(800, 200, 3);
  EXPECT_EQ(again.x_train, d.x_train);
  EXPECT_TRUE(at::equal(again.y_test, d.y_test));
  EXPECT_NE(text_topics(800, 200, 4).x_train, d.x_train);
  EXPECT_THROW(text_topics(0, 10, 1), ValueError);
}

// A Dataset of a string tensor and labels batches, shuffles and prefetches
// the strings (rows of one width); a TextVectorization adapts from it.
TEST(TextTopics, StringDatasetsBatchShuffleAndAdapt) {
  auto d = text_topics(300, 10, 5);
  at::Tensor x = strings::encode(d.x_train);
  auto ds = data::Dataset::from_tensor_slices({x, d.y_train}).shuffle(300, 7).batch(64).prefetch(2);
  std::multiset<std::string> seen;
  int64_t batches = 0;
  auto it = ds.iterator();
  while (auto e = it->next()) {
    ++batches;
    EXPECT_EQ(strings::logical_shape((*e)[0]).size(), 1u);
    auto texts = strings::decode((*e)[0]);
    ASSERT_EQ((int64_t)texts.size(), (*e)[1].size(0));
    for (size_t i = 0; i < texts.size(); ++i) {
      // Each text keeps its label through the shuffle.
      const auto pos = std::find(d.x_train.begin(), d.x_train.end(), texts[i]) - d.x_train.begin();
      EXPECT_EQ(d.y_train[pos].item<int64_t>(), (*e)[1][i].item<int64_t>());
      seen.insert(texts[i]);
    }
  }
  EXPECT_EQ(batches, 5);
  EXPECT_EQ(seen, std::multiset<std::string>(d.x_train.begin(), d.x_train.end()));

  auto from_data = layers::TextVectorization(Json{{"max_tokens", 200}});
  adapt(*from_data, data::Dataset::from_tensor_slices({x, d.y_train}).batch(64));
  auto from_strings = layers::TextVectorization(Json{{"max_tokens", 200}});
  from_strings->adapt(d.x_train);
  EXPECT_EQ(from_data->get_vocabulary(), from_strings->get_vocabulary());
  // Strings encoded one by one have different widths: batch() says how to pad them.
  std::vector<at::Tensor> rows = {strings::encode({"a"}, {}), strings::encode({"abc"}, {})};
  auto uneven = data::Dataset::from_generator([rows]() {
    auto next = std::make_shared<size_t>(0);
    return [rows, next]() -> std::optional<Element> {
      if (*next >= rows.size()) return std::nullopt;
      return Element{rows[(*next)++]};
    };
  });
  try {
    uneven.batch(2).iterator()->next();
    ADD_FAILURE() << "batch() stacked strings of two widths";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("strings::pad_to_width"), std::string::npos) << e.what();
  }
  auto first_two = layers::StringLookup();
  adapt(*first_two, data::Dataset::from_tensor_slices({strings::encode({"a", "b", "b", "c", "c", "c"})}).batch(2), 2);
  EXPECT_EQ(first_two->get_vocabulary(false), (std::vector<std::string>{"b", "c", "a"}));
}

}  // namespace
}  // namespace kiln::datasets
