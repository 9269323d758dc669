#include "kiln/data/dataset.h"

#include <ATen/Parallel.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <numeric>
#include <set>
#include <thread>

#include "kiln/core/device.h"
#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/core/random.h"
#include "kiln/data/adapt.h"
#include "kiln/testing/expect_error.h"
#include "kiln/testing/testing.h"

namespace kiln {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<Element> collect(const data::Dataset& ds, int64_t epoch = 0) {
  std::vector<Element> out;
  auto it = ds.iterator(epoch);
  while (auto e = it->next()) out.push_back(std::move(*e));
  return out;
}

// Datasets of int64 scalars (or batches of them): the values, flattened.
std::vector<int64_t> values(const data::Dataset& ds, int64_t epoch = 0) {
  std::vector<int64_t> out;
  for (const auto& e : collect(ds, epoch)) {
    auto t = e[0].contiguous();
    for (int64_t i = 0; i < t.numel(); ++i) out.push_back(t.reshape({-1})[i].item<int64_t>());
  }
  return out;
}

// Sizes of the leading dim of each batch.
std::vector<int64_t> batch_sizes(const data::Dataset& ds) {
  std::vector<int64_t> out;
  for (const auto& e : collect(ds)) out.push_back(e[0].size(0));
  return out;
}

std::vector<int64_t> iota(int64_t n, int64_t start = 0) {
  std::vector<int64_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

data::Dataset range(int64_t n) { return data::Dataset::from_tensor_slices({at::arange(n, at::kLong)}); }

// The same elements through a generator: not row-indexed, so every op takes
// its element path (stacking, element shuffle buffer).
data::Dataset range_generator(int64_t n, std::shared_ptr<std::atomic<int>> calls = nullptr) {
  return data::Dataset::from_generator(
      [n, calls] {
        auto i = std::make_shared<int64_t>(0);
        return [n, i, calls]() -> std::optional<Element> {
          if (*i >= n) return std::nullopt;
          if (calls) ++*calls;
          return Element{at::scalar_tensor((*i)++, at::kLong)};
        };
      },
      n);
}

// ---------------------------------------------------------------- sources

TEST(DatasetTest, FromTensorSlicesYieldsRowsInOrder) {
  auto x = at::arange(12, at::kFloat).reshape({4, 3});
  auto y = at::arange(4, at::kLong);
  auto ds = data::Dataset::from_tensor_slices({x, y});
  EXPECT_EQ(ds.cardinality(), 4);
  auto elems = collect(ds);
  ASSERT_EQ(elems.size(), 4u);
  for (int64_t i = 0; i < 4; ++i) {
    ASSERT_EQ(elems[i].size(), 2u);
    EXPECT_TRUE(elems[i][0].equal(x[i]));
    EXPECT_EQ(elems[i][1].item<int64_t>(), i);
    EXPECT_EQ(elems[i][1].dim(), 0);
  }
}

TEST(DatasetTest, FromTensorSlicesRejectsDifferentLengths) {
  auto msg = error_of<std::exception>([] { data::Dataset::from_tensor_slices({at::zeros({5, 2}), at::zeros({4})}); });
  EXPECT_THAT(msg, HasSubstr("[5, 4]"));
  EXPECT_THROW(data::Dataset::from_tensor_slices({at::zeros({5}), at::zeros({4})}), ValueError);
  EXPECT_THROW(data::Dataset::from_tensor_slices({at::scalar_tensor(1.0)}), ValueError);
  EXPECT_THROW(data::Dataset::from_tensor_slices({}), ValueError);
}

TEST(DatasetTest, FromTensorsIsOneElement) {
  auto ds = data::Dataset::from_tensors({at::ones({2, 2}), at::zeros({3})});
  EXPECT_EQ(ds.cardinality(), 1);
  auto elems = collect(ds);
  ASSERT_EQ(elems.size(), 1u);
  EXPECT_EQ(elems[0][0].sizes(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(elems[0][1].sizes(), (std::vector<int64_t>{3}));
}

TEST(DatasetTest, FromGeneratorStartsAFreshGeneratorEachPass) {
  auto calls = std::make_shared<std::atomic<int>>(0);
  auto ds = range_generator(5, calls);
  EXPECT_EQ(ds.cardinality(), 5);
  EXPECT_EQ(values(ds), iota(5));
  EXPECT_EQ(values(ds), iota(5));
  EXPECT_EQ(calls->load(), 10);
  EXPECT_EQ(data::Dataset::from_generator([] { return [] { return std::optional<Element>(); }; }).cardinality(),
            kUnknownCardinality);
}

TEST(DatasetTest, IteratorKeepsItsDatasetAlive) {
  auto it = range(3).map([](const Element& e) { return Element{e[0] * 2}; }).batch(2).iterator();
  auto b = it->next();
  ASSERT_TRUE(b);
  EXPECT_EQ((*b)[0][1].item<int64_t>(), 2);
}

// ------------------------------------------------------------------ batch

TEST(DatasetTest, BatchStacksAndKeepsTheRemainder) {
  for (const data::Dataset& base : {range(10), range_generator(10)}) {
    auto ds = base.batch(3);
    EXPECT_EQ(ds.cardinality(), 4);
    EXPECT_EQ(batch_sizes(ds), (std::vector<int64_t>{3, 3, 3, 1}));
    EXPECT_EQ(values(ds), iota(10));
    auto dropped = base.batch(3, /*drop_remainder=*/true);
    EXPECT_EQ(dropped.cardinality(), 3);
    EXPECT_EQ(batch_sizes(dropped), (std::vector<int64_t>{3, 3, 3}));
    EXPECT_EQ(values(dropped), iota(9));
    EXPECT_EQ(batch_sizes(base.batch(5, true)), (std::vector<int64_t>{5, 5}));
    EXPECT_EQ(batch_sizes(base.batch(20, true)), (std::vector<int64_t>{}));
    EXPECT_EQ(batch_sizes(base.batch(20)), (std::vector<int64_t>{10}));
  }
}

TEST(DatasetTest, BatchOfMultiTensorElementsKeepsRowsAligned) {
  auto x = at::arange(40, at::kFloat).reshape({20, 2});
  auto y = at::arange(20, at::kLong);
  auto img = at::arange(20 * 4, at::kByte).reshape({20, 2, 2});
  auto flag = (at::arange(20, at::kLong) % 3).eq(0);
  auto ds = data::Dataset::from_tensor_slices({x, y, img, flag}).shuffle(20, 3).batch(6);
  int64_t rows = 0;
  for (const auto& b : collect(ds)) {
    ASSERT_EQ(b.size(), 4u);
    EXPECT_EQ(b[0].dim(), 2);
    EXPECT_TRUE(b[0].equal(x.index_select(0, b[1])));
    EXPECT_EQ(b[2].scalar_type(), at::kByte);
    EXPECT_TRUE(b[2].equal(img.index_select(0, b[1])));
    EXPECT_EQ(b[3].scalar_type(), at::kBool);
    EXPECT_TRUE(b[3].equal(flag.index_select(0, b[1])));
    rows += b[0].size(0);
  }
  EXPECT_EQ(rows, 20);
  // Unshuffled batches of in-memory rows are views (no copy).
  auto first = data::Dataset::from_tensor_slices({x}).batch(4).iterator()->next();
  EXPECT_EQ((*first)[0].data_ptr(), x.data_ptr());
}

TEST(DatasetTest, BatchOfMismatchedShapesNamesBothShapes) {
  auto ds = data::Dataset::from_generator([] {
    auto i = std::make_shared<int>(0);
    return [i]() -> std::optional<Element> {
      if (*i >= 2) return std::nullopt;
      return Element{at::zeros({2, 1 + (*i)++})};
    };
  });
  auto it = ds.batch(2).iterator();
  try {
    it->next();
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_THAT(e.what(), HasSubstr("[2, 1]"));
    EXPECT_THAT(e.what(), HasSubstr("[2, 2]"));
  }
  EXPECT_THROW(range(3).batch(0), ValueError);
}

TEST(DatasetTest, UnbatchInvertsBatch) {
  auto x = at::arange(14, at::kFloat).reshape({7, 2});
  auto ds = data::Dataset::from_tensor_slices({x}).batch(3).unbatch();
  auto elems = collect(ds);
  ASSERT_EQ(elems.size(), 7u);
  for (int64_t i = 0; i < 7; ++i) EXPECT_TRUE(elems[i][0].equal(x[i]));
  EXPECT_EQ(values(range(5).batch(2).unbatch().batch(4)), iota(5));
  EXPECT_THROW(collect(range(3).unbatch()), ShapeError);  // elements are scalars
}

// ------------------------------------------------- repeat / take / skip

TEST(DatasetTest, RepeatTakeSkipInterplay) {
  for (const data::Dataset& base : {range(10), range_generator(10)}) {
    EXPECT_EQ(values(base.skip(2).take(3)), (std::vector<int64_t>{2, 3, 4}));
    EXPECT_EQ(values(base.take(5).skip(2)), (std::vector<int64_t>{2, 3, 4}));
    EXPECT_EQ(values(base.repeat(2).skip(8).take(4)), (std::vector<int64_t>{8, 9, 0, 1}));
    EXPECT_EQ(values(base.take(3).repeat(3)), (std::vector<int64_t>{0, 1, 2, 0, 1, 2, 0, 1, 2}));
    EXPECT_EQ(values(base.repeat().take(23)).size(), 23u);
    EXPECT_EQ(values(base.take(-1)), iota(10));
    EXPECT_EQ(values(base.skip(-1)), std::vector<int64_t>{});
    EXPECT_EQ(values(base.skip(20)), std::vector<int64_t>{});
    EXPECT_EQ(values(base.take(0)), std::vector<int64_t>{});
    EXPECT_EQ(values(base.repeat(0)), std::vector<int64_t>{});
    EXPECT_EQ(values(base.repeat(2).batch(4)),
              (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
    EXPECT_EQ(batch_sizes(base.repeat(2).batch(4)), (std::vector<int64_t>{4, 4, 4, 4, 4}));
  }
  // An empty input under repeat() ends instead of spinning.
  EXPECT_EQ(values(range(3).skip(3).repeat()), std::vector<int64_t>{});
  EXPECT_EQ(values(range_generator(0).repeat()), std::vector<int64_t>{});
}

TEST(DatasetTest, Cardinality) {
  auto ds = range(10);
  EXPECT_EQ(ds.repeat().cardinality(), kInfiniteCardinality);
  EXPECT_EQ(ds.repeat(3).cardinality(), 30);
  EXPECT_EQ(ds.repeat().take(7).cardinality(), 7);
  EXPECT_EQ(ds.repeat().skip(7).cardinality(), kInfiniteCardinality);
  EXPECT_EQ(ds.take(4).cardinality(), 4);
  EXPECT_EQ(ds.take(40).cardinality(), 10);
  EXPECT_EQ(ds.skip(4).cardinality(), 6);
  EXPECT_EQ(ds.skip(40).cardinality(), 0);
  EXPECT_EQ(ds.shard(3, 0).cardinality(), 4);
  EXPECT_EQ(ds.shard(3, 2).cardinality(), 3);
  EXPECT_EQ(ds.batch(4).cardinality(), 3);
  EXPECT_EQ(ds.batch(4, true).cardinality(), 2);
  EXPECT_EQ(ds.batch(4).unbatch().cardinality(), kUnknownCardinality);
  EXPECT_EQ(ds.shuffle(3).map([](const Element& e) { return e; }).prefetch(2).cache().cardinality(), 10);
  EXPECT_EQ(ds.repeat().batch(3).cardinality(), kInfiniteCardinality);
  EXPECT_EQ(range_generator(0).repeat().cardinality(), 0);
  auto unknown = data::Dataset::from_generator([] { return [] { return std::optional<Element>(); }; });
  EXPECT_EQ(unknown.take(3).cardinality(), kUnknownCardinality);
  EXPECT_EQ(unknown.repeat().cardinality(), kInfiniteCardinality);
}

TEST(DatasetTest, ShardSplitsByIndexModuloShards) {
  for (const data::Dataset& base : {range(10), range_generator(10)}) {
    EXPECT_EQ(values(base.shard(3, 0)), (std::vector<int64_t>{0, 3, 6, 9}));
    EXPECT_EQ(values(base.shard(3, 1)), (std::vector<int64_t>{1, 4, 7}));
    EXPECT_EQ(values(base.shard(3, 2)), (std::vector<int64_t>{2, 5, 8}));
    EXPECT_EQ(values(base.shard(1, 0)), iota(10));
    EXPECT_EQ(values(base.shard(20, 9)), (std::vector<int64_t>{9}));
    EXPECT_EQ(values(base.shard(20, 15)), std::vector<int64_t>{});
    EXPECT_EQ(values(base.shard(2, 1).batch(2)), (std::vector<int64_t>{1, 3, 5, 7, 9}));
  }
  EXPECT_THROW(range(3).shard(2, 2), ValueError);
  EXPECT_THROW(range(3).shard(0, 0), ValueError);
}

// ---------------------------------------------------------------- shuffle

TEST(DatasetTest, ShufflePermutesDeterministicallyPerSeedAndEpoch) {
  auto ds = range(100).shuffle(100, /*seed=*/7);
  auto a = values(ds, 0);
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, iota(100));
  EXPECT_NE(a, iota(100));
  // Same (seed, epoch): same order, from another Dataset object too.
  EXPECT_EQ(values(ds, 0), a);
  EXPECT_EQ(values(range(100).shuffle(100, 7), 0), a);
  // Another epoch or seed: another order.
  EXPECT_NE(values(ds, 1), a);
  EXPECT_EQ(values(ds, 1), values(ds, 1));
  EXPECT_NE(values(range(100).shuffle(100, 8), 0), a);
  // reshuffle_each_iteration=false: one order for every epoch.
  auto fixed = range(100).shuffle(100, 7, /*reshuffle_each_iteration=*/false);
  EXPECT_EQ(values(fixed, 0), values(fixed, 5));
  EXPECT_NE(values(fixed, 0), iota(100));
}

TEST(DatasetTest, ShuffleWithoutSeedRepeatsAfterSetRandomSeed) {
  set_random_seed(123);
  auto a = values(range(50).shuffle(50), 0);
  set_random_seed(123);
  auto b = values(range(50).shuffle(50), 0);
  EXPECT_EQ(a, b);
}

TEST(DatasetTest, ShuffleBufferBoundsHowFarElementsMove) {
  for (const data::Dataset& base : {range(200), range_generator(200)}) {
    EXPECT_EQ(values(base.shuffle(1, 3)), iota(200));  // buffer of one: no shuffle
    const int64_t buffer = 10;
    auto v = values(base.shuffle(buffer, 3));
    auto sorted = v;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, iota(200));
    EXPECT_NE(v, iota(200));
    // Output p is drawn from a buffer holding at most inputs [0, p + buffer).
    for (size_t p = 0; p < v.size(); ++p) EXPECT_LT(v[p], static_cast<int64_t>(p) + buffer) << "at " << p;
  }
}

TEST(DatasetTest, ShuffleOrderIsTheSameOnTheFastAndElementPaths) {
  // from_tensor_slices shuffles indices and gathers; a generator shuffles
  // elements and stacks. Both must give the same batches.
  for (int64_t buffer : {1, 7, 64, 1000}) {
    for (bool drop : {false, true}) {
      auto fast = values(range(100).shuffle(buffer, 11).batch(8, drop), 3);
      auto slow = values(range_generator(100).shuffle(buffer, 11).batch(8, drop), 3);
      EXPECT_EQ(fast, slow) << "buffer " << buffer;
    }
  }
  auto pipeline = [](const data::Dataset& d) {
    return d.shuffle(30, 5).repeat(3).shard(2, 1).skip(4).take(50).shuffle(9, 2).batch(7);
  };
  EXPECT_EQ(values(pipeline(range(40)), 2), values(pipeline(range_generator(40)), 2));
}

TEST(DatasetTest, RepeatReshufflesEachRepetition) {
  auto v = values(range(20).shuffle(20, 1).repeat(2));
  ASSERT_EQ(v.size(), 40u);
  std::vector<int64_t> first(v.begin(), v.begin() + 20), second(v.begin() + 20, v.end());
  EXPECT_NE(first, second);
  std::sort(second.begin(), second.end());
  EXPECT_EQ(second, iota(20));
  auto same = values(range(20).shuffle(20, 1, false).repeat(2));
  EXPECT_EQ(std::vector<int64_t>(same.begin(), same.begin() + 20), std::vector<int64_t>(same.begin() + 20, same.end()));
}

// ------------------------------------------------------------ skip_batches

TEST(DatasetTest, SkipBatchesResumesMidEpoch) {
  auto check = [](const data::Dataset& ds, int64_t epoch) {
    auto full = collect(ds, epoch);
    for (int64_t k : {0, 1, 3, static_cast<int>(full.size()), static_cast<int>(full.size()) + 2}) {
      auto it = ds.iterator(epoch);
      EXPECT_EQ(it->skip_batches(k), std::min<int64_t>(k, full.size()));
      size_t i = std::min<size_t>(k, full.size());
      while (auto e = it->next()) {
        ASSERT_LT(i, full.size());
        EXPECT_TRUE((*e)[0].equal(full[i][0])) << "batch " << i << " after skipping " << k;
        ++i;
      }
      EXPECT_EQ(i, full.size());
    }
  };
  auto twice = [](const Element& e) { return Element{e[0] * 2}; };
  check(range(50).shuffle(50, 4).batch(8), 2);
  check(range(50).shuffle(50, 4).batch(8, true), 2);
  check(range_generator(50).shuffle(16, 4).batch(8), 1);
  check(range(50).shuffle(10, 4).map(twice).batch(8).prefetch(2), 3);
  check(range(50).map(twice, 3).batch(8), 0);
  check(range(50).shard(3, 1).repeat(2).batch(4), 1);
  check(range(50).batch(8).cache(), 0);
}

// ------------------------------------------------------------------- map

TEST(DatasetTest, MapAppliesTheFunction) {
  auto ds = range(5).map([](const Element& e) { return Element{e[0] * 10, e[0] + 1}; });
  auto elems = collect(ds);
  ASSERT_EQ(elems.size(), 5u);
  for (int64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(elems[i][0].item<int64_t>(), 10 * i);
    EXPECT_EQ(elems[i][1].item<int64_t>(), i + 1);
  }
}

TEST(DatasetTest, ParallelMapKeepsOrder) {
  // Work that varies per element, so workers finish out of order.
  auto fn = [](const Element& e) {
    const int64_t i = e[0].item<int64_t>();
    auto m = at::ones({8 + (i % 7) * 24, 8 + (i % 7) * 24});
    for (int r = 0; r < 1 + (i % 3); ++r) m = at::mm(m, m) / m.size(0);
    return Element{e[0] * 3, m.sum()};
  };
  auto v = values(range(200).map(fn, 4));
  std::vector<int64_t> want;
  for (int64_t i = 0; i < 200; ++i) want.push_back(3 * i);
  EXPECT_EQ(v, want);
  EXPECT_EQ(values(range(200).map(fn, kAutotune).batch(16)), want);
  EXPECT_THROW(range(3).map(fn, 0), ValueError);
}

TEST(DatasetTest, ParallelMapPropagatesErrorsInOrder) {
  auto ds = range(50).map(
      [](const Element& e) {
        if (e[0].item<int64_t>() == 13) throw ValueError("element 13 is bad");
        return e;
      },
      4);
  auto it = ds.iterator();
  for (int64_t i = 0; i < 13; ++i) {
    auto e = it->next();
    ASSERT_TRUE(e);
    EXPECT_EQ((*e)[0].item<int64_t>(), i);
  }
  EXPECT_THROW(it->next(), ValueError);
  // Destroyed with work in flight: joins cleanly.
  auto it2 = range(1000).map([](const Element& e) { return e; }, 4).iterator();
  it2->next();
  it2.reset();
}

// ----------------------------------------------------------------- cache

TEST(DatasetTest, MemoryCacheFillsOnlyAfterAFullPass) {
  auto calls = std::make_shared<std::atomic<int>>(0);
  auto ds = range_generator(6, calls).cache();
  {
    auto it = ds.iterator();  // partial pass: caches nothing
    it->next();
    it->next();
  }
  EXPECT_EQ(calls->load(), 2);
  EXPECT_EQ(values(ds), iota(6));
  EXPECT_EQ(calls->load(), 8);
  EXPECT_EQ(values(ds, 1), iota(6));  // from memory
  EXPECT_EQ(values(ds.batch(4), 2), iota(6));
  EXPECT_EQ(calls->load(), 8);
}

// cache_on_device: on the CPU it is cache(); a device this machine lacks is
// one error naming what there is.
TEST(DatasetTest, CacheOnDeviceOnTheCpuIsTheMemoryCache) {
  auto calls = std::make_shared<std::atomic<int>>(0);
  auto ds = range_generator(6, calls).cache_on_device("cpu");
  EXPECT_EQ(values(ds), iota(6));
  EXPECT_EQ(values(ds, 1), iota(6));
  EXPECT_EQ(calls->load(), 6) << "the second pass read the cache";
  if (gpu_count() == 0) {
    try {
      range(3).cache_on_device("cuda:0");
      ADD_FAILURE() << "no error for a GPU this machine lacks";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("Dataset.cache_on_device"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("use --device cpu"), std::string::npos) << e.what();
    }
  }
}

// On a GPU the cached elements stay there: the second pass hands out the
// same values, already on the device.
TEST(DatasetCUDA, CacheOnDeviceKeepsTheElementsOnTheGpu) {
  auto calls = std::make_shared<std::atomic<int>>(0);
  auto ds = range_generator(6, calls).cache_on_device("cuda:0");
  EXPECT_EQ(values(ds), iota(6));
  auto it = ds.iterator(1);
  for (int64_t i = 0; i < 6; ++i) {
    auto e = it->next();
    ASSERT_TRUE(e);
    EXPECT_TRUE((*e)[0].is_cuda());
    EXPECT_EQ((*e)[0].item<int64_t>(), i);
  }
  EXPECT_EQ(calls->load(), 6);
}

TEST(DatasetTest, FileCacheIsWrittenAtTheEndOfAFullPassAndReused) {
  TempDir dir;
  const std::string path = join_path(dir.path(), "sub/cache.bin");
  auto calls = std::make_shared<std::atomic<int>>(0);
  auto source = range_generator(8, calls).map([](const Element& e) {
    return Element{e[0], at::full({2, 3}, e[0].item<double>(), at::kFloat), e[0].to(at::kBool)};
  });
  {
    auto it = source.cache(path).iterator();
    for (int i = 0; i < 5; ++i) it->next();
  }
  EXPECT_FALSE(path_exists(path)) << "a partial pass must not leave a cache file";
  auto first = collect(source.cache(path));
  EXPECT_TRUE(path_exists(path));
  EXPECT_EQ(calls->load(), 5 + 8);
  // A new Dataset (as in a new process) reads the file, not the source.
  auto again = collect(source.cache(path), 4);
  EXPECT_EQ(calls->load(), 5 + 8);
  ASSERT_EQ(again.size(), first.size());
  for (size_t i = 0; i < first.size(); ++i) {
    ASSERT_EQ(again[i].size(), 3u);
    for (size_t j = 0; j < 3; ++j) {
      EXPECT_EQ(again[i][j].scalar_type(), first[i][j].scalar_type());
      EXPECT_TRUE(again[i][j].equal(first[i][j]));
    }
  }
  EXPECT_EQ(values(source.cache(path).shuffle(8, 1).batch(3)).size(), 8u);
  std::vector<std::string> leftovers = list_directory(join_path(dir.path(), "sub"));
  EXPECT_THAT(leftovers, ElementsAre("cache.bin"));
}

TEST(DatasetTest, FileCacheCorruptionIsAFormatError) {
  TempDir dir;
  const std::string path = join_path(dir.path(), "cache.bin");
  auto ds = range(20).batch(4).cache(path);
  collect(ds);
  const std::string good = read_file(path);
  auto expect_format_error = [&](const std::string& bytes, const std::string& what) {
    atomic_write_file(path, bytes);
    try {
      collect(ds);
      ADD_FAILURE() << "no FormatError for " << what;
    } catch (const FormatError& e) {
      EXPECT_THAT(e.what(), HasSubstr(path)) << what;
    }
  };
  std::string flipped = good;
  flipped[good.size() - 3] ^= 0x10;
  expect_format_error(flipped, "a flipped data byte");
  expect_format_error(good.substr(0, good.size() - 5), "a truncated file");
  expect_format_error(good + "x", "an extra byte");
  expect_format_error(good.substr(0, 20), "a truncated header");
  std::string magic = good;
  magic[0] = 'X';
  expect_format_error(magic, "a bad magic");
  std::string count = good;
  count[16] ^= 1;  // element count; header CRC catches it
  expect_format_error(count, "a changed element count");
  atomic_write_file(path, good);
  EXPECT_EQ(values(ds), iota(20));
}

// --------------------------------------------------------------- prefetch

TEST(DatasetTest, PrefetchYieldsTheSameElements) {
  EXPECT_EQ(values(range(100).shuffle(100, 2).batch(7).prefetch(3), 1), values(range(100).shuffle(100, 2).batch(7), 1));
  EXPECT_EQ(values(range_generator(30).prefetch(1)), iota(30));
  EXPECT_EQ(values(range_generator(30).prefetch(kAutotune).prefetch(2)), iota(30));
  EXPECT_THROW(range(3).prefetch(0), ValueError);
}

TEST(DatasetTest, PrefetchOfInMemoryDataWithOrWithoutASpareCore) {
  // Threaded when a core is spare, produced in next() when intra-op threads
  // cover every core: the same elements either way.
  const int old_threads = at::get_num_threads();
  auto ds = range(100).shuffle(100, 2).batch(7).prefetch(2);
  auto want = values(range(100).shuffle(100, 2).batch(7), 1);
  for (int threads : {1, static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))}) {
    at::set_num_threads(threads);
    EXPECT_EQ(values(ds, 1), want) << threads << " threads";
    auto it = ds.iterator(1);
    EXPECT_EQ(it->skip_batches(3), 3);
    EXPECT_EQ(values(ds.skip(3), 1).size(), want.size() - 21);
  }
  at::set_num_threads(old_threads);
}

TEST(DatasetTest, PrefetchRethrowsProducerErrorsAfterEarlierElements) {
  auto ds = data::Dataset::from_generator([] {
              auto i = std::make_shared<int64_t>(0);
              return [i]() -> std::optional<Element> {
                if (*i == 3) throw FormatError("bad record 3");
                return Element{at::scalar_tensor((*i)++, at::kLong)};
              };
            }).prefetch(2);
  auto it = ds.iterator();
  for (int64_t i = 0; i < 3; ++i) {
    auto e = it->next();
    ASSERT_TRUE(e);
    EXPECT_EQ((*e)[0].item<int64_t>(), i);
  }
  try {
    it->next();
    FAIL() << "expected the producer's FormatError";
  } catch (const FormatError& e) {
    EXPECT_THAT(e.what(), HasSubstr("bad record 3"));
  }
  EXPECT_FALSE(it->next());
}

TEST(DatasetTest, PrefetchJoinsWhenDestroyedEarly) {
  auto produced = std::make_shared<std::atomic<int64_t>>(0);
  auto endless = data::Dataset::from_generator([produced] {
    return [produced]() -> std::optional<Element> { return Element{at::scalar_tensor((*produced)++)}; };
  });
  for (int round = 0; round < 20; ++round) {
    auto it = endless.prefetch(2).iterator();
    if (round % 2) it->next();  // destroyed with a full queue / before starting
  }
  // A bounded queue: the producer never ran far ahead.
  EXPECT_LE(produced->load(), 10 * (2 + 2));
  auto it = endless.map([](const Element& e) { return e; }, 2).prefetch(4).iterator();
  for (int i = 0; i < 10; ++i) it->next();
  it.reset();
}

TEST(DatasetTest, PipelineThreadsRunAtenOpsSerially) {
  // Like tf.data's max_intra_op_parallelism=1: prefetch and map workers must
  // not start OpenMP teams of their own.
  const int old_threads = at::get_num_threads();
  at::set_num_threads(2);  // so the check means something under KILN_NUM_THREADS=1
  auto seen = std::make_shared<std::atomic<int>>(0);
  auto ds = range(8)
                .map(
                    [seen](const Element& e) {
                      seen->store(std::max(seen->load(), at::get_num_threads()));
                      return e;
                    },
                    2)
                .prefetch(2);
  EXPECT_EQ(values(ds), iota(8));
  EXPECT_EQ(seen->load(), 1);
  auto gen_threads = std::make_shared<std::atomic<int>>(0);
  auto gen = data::Dataset::from_generator([gen_threads] {
    return [gen_threads]() -> std::optional<Element> {
      gen_threads->store(at::get_num_threads());
      return std::nullopt;
    };
  });
  collect(gen.prefetch(1));
  EXPECT_EQ(gen_threads->load(), 1);
  EXPECT_EQ(at::get_num_threads(), 2);  // the caller's thread keeps its count
  at::set_num_threads(old_threads);
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// --- adapt(Normalization, Dataset) --------------------------------------------------
TEST(Adapt, DatasetBatchesGiveTheSameStatisticsAsOneTensor) {
  at::Tensor x = at::randn({103, 4}, at::kDouble) * 3 + 2;
  x.select(1, 2).mul_(100);  // features on very different scales
  at::Tensor y = at::zeros({103}, at::kLong);
  auto whole = layers::Normalization();
  whole->adapt(x.to(at::kFloat));
  auto streamed = layers::Normalization();
  adapt(*streamed, data::Dataset::from_tensor_slices({x.to(at::kFloat), y}).batch(10));  // uneven last batch
  EXPECT_TRUE(at::allclose(streamed->mean(), whole->mean(), 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(streamed->variance(), whole->variance(), 1e-5, 1e-6));
  at::Tensor expected_var = x.var(0, /*unbiased=*/false).to(at::kFloat);
  EXPECT_TRUE(at::allclose(streamed->variance().reshape({4}), expected_var, 1e-4, 1e-5));
  EXPECT_EQ(streamed->weights().back()->value().item<int64_t>(), 103);
  // steps limits the batches read: 2 batches = the first 20 rows.
  auto partial = layers::Normalization();
  adapt(*partial, data::Dataset::from_tensor_slices({x.to(at::kFloat)}).batch(10), /*steps=*/2);
  EXPECT_TRUE(at::allclose(partial->mean().reshape({4}), x.narrow(0, 0, 20).mean(0).to(at::kFloat), 1e-5, 1e-6));
  // An empty dataset is a clear error.
  auto empty = layers::Normalization();
  EXPECT_THROW(adapt(*empty, data::Dataset::from_tensor_slices({x}).take(0).batch(4)), ValueError);
}

}  // namespace
}  // namespace kiln
