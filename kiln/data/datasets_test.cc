#include "kiln/data/datasets.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <zlib.h>

#include <optional>
#include <string>

#include "kiln/core/error.h"
#include "kiln/core/io.h"
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
  auto ds = Dataset::from_tensor_slices({d.x_train, d.y_train}).shuffle(60000, 1).batch(128);
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

}  // namespace
}  // namespace kiln::datasets
