// DeviceMesh and LayoutMap (Keras 3 semantics): mesh validation, rank
// coordinates, shard shapes and ranges, and the LayoutMap lookup (exact key,
// then one regex match; several matches are an error naming the keys).
#include "kiln/distribute/layout.h"

#include <gtest/gtest.h>

#include "kiln/core/error.h"

namespace kiln::distribute {
namespace {

TEST(DeviceMesh, ValidatesShapeNamesAndDevices) {
  DeviceMesh mesh({2, 4}, {"batch", "model"});
  EXPECT_EQ(mesh.size(), 8);
  EXPECT_EQ(mesh.devices().front(), "rank:0");
  EXPECT_EQ(mesh.axis("model"), 1);
  EXPECT_EQ(mesh.axis_size("batch"), 2);
  EXPECT_THROW(mesh.axis("data"), ValueError);
  EXPECT_THROW(DeviceMesh({2}, {"a", "b"}), ValueError);                // lengths differ
  EXPECT_THROW(DeviceMesh({2, 2}, {"a", "a"}), ValueError);             // repeated name
  EXPECT_THROW(DeviceMesh({0}, {"a"}), ValueError);                     // empty axis
  EXPECT_THROW(DeviceMesh({2, 2}, {"a", "b"}, {"cpu:0"}), ValueError);  // 4 devices needed
  EXPECT_NO_THROW(DeviceMesh({2}, {"model"}, {"cuda:0", "cuda:1"}));
}

TEST(DeviceMesh, RanksAreRowMajorCoordinates) {
  DeviceMesh mesh({2, 3}, {"batch", "model"});
  EXPECT_EQ(mesh.coordinates(0), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(mesh.coordinates(2), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(mesh.coordinates(4), (std::vector<int64_t>{1, 1}));
  EXPECT_THROW(mesh.coordinates(6), ValueError);
}

TEST(DeviceMesh, ShardShapesAndRangesFollowTheLayout) {
  DeviceMesh mesh({2, 2}, {"batch", "model"});
  TensorLayout column{{"", "model"}}, row{{"model", ""}}, both{{"batch", "model"}};
  EXPECT_EQ(mesh.shard_shape({784, 1024}, column), (Shape{784, 512}));
  EXPECT_EQ(mesh.shard_shape({784, 1024}, row), (Shape{392, 1024}));
  EXPECT_EQ(mesh.shard_shape({8, 6}, both), (Shape{4, 3}));
  EXPECT_EQ(mesh.shard_shape({10}, TensorLayout{}), (Shape{10}));  // replicated
  // Rank 3 is (batch 1, model 1): the second half along each sharded axis.
  auto r = mesh.shard_ranges({8, 6}, both, 3);
  EXPECT_EQ(r[0], (std::pair<int64_t, int64_t>{4, 8}));
  EXPECT_EQ(r[1], (std::pair<int64_t, int64_t>{3, 6}));
  // Rank 1 is (batch 0, model 1): a column-parallel kernel's second half of
  // the columns, all rows.
  r = mesh.shard_ranges({784, 1024}, column, 1);
  EXPECT_EQ(r[0], (std::pair<int64_t, int64_t>{0, 784}));
  EXPECT_EQ(r[1], (std::pair<int64_t, int64_t>{512, 1024}));
  // Shards of all ranks along "model" tile the dimension exactly once.
  int64_t covered = 0;
  for (int rank : {0, 1})
    covered += mesh.shard_ranges({1024}, TensorLayout{{"model"}}, rank)[0].second -
               mesh.shard_ranges({1024}, TensorLayout{{"model"}}, rank)[0].first;
  EXPECT_EQ(covered, 1024);
  EXPECT_THROW(mesh.shard_shape({7, 4}, row), ValueError);                               // 7 does not split over 2
  EXPECT_THROW(mesh.shard_shape({4}, column), ValueError);                               // more axes than dims
  EXPECT_THROW(mesh.shard_shape({4, 4}, TensorLayout{{"model", "model"}}), ValueError);  // axis twice
  EXPECT_THROW(mesh.shard_shape({4, 4}, TensorLayout{{"heads", ""}}), ValueError);       // unknown axis
}

TEST(LayoutMap, ExactKeyThenOneRegexMatch) {
  LayoutMap map(DeviceMesh({2}, {"model"}));
  map.set("dense.*kernel", {{"", "model"}});
  map.set("dense.*bias", {{"model"}});
  map.set("dense_1/output", {{"", "model"}});  // a layer output
  map.set("sequential/dense_2/kernel", {{"model", ""}});
  EXPECT_EQ(map.get("sequential/dense_1/kernel")->axes, (std::vector<std::string>{"", "model"}));
  EXPECT_EQ(map.get("sequential/dense_1/bias")->axes, (std::vector<std::string>{"model"}));
  // The exact key wins over the regex that also matches it.
  EXPECT_EQ(map.get("sequential/dense_2/kernel")->axes, (std::vector<std::string>{"model", ""}));
  EXPECT_FALSE(map.get("sequential/embedding/embeddings").has_value());  // replicated
  EXPECT_EQ(map.keys().size(), 4u);
  map.set("dense.*bias", {{}});  // replaces
  EXPECT_EQ(map.keys().size(), 4u);
  EXPECT_TRUE(map.get("sequential/dense_1/bias")->axes.empty());
}

TEST(LayoutMap, SeveralMatchesAndBadKeysAreErrorsThatNameThem) {
  LayoutMap map(DeviceMesh({2}, {"model"}));
  map.set("kernel", {{"", "model"}});
  map.set("dense", {{"model", ""}});
  try {
    map.get("sequential/dense/kernel");
    FAIL() << "expected a ValueError";
  } catch (const ValueError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("sequential/dense/kernel"), std::string::npos) << m;
    EXPECT_NE(m.find("'kernel'"), std::string::npos) << m;
    EXPECT_NE(m.find("'dense'"), std::string::npos) << m;
  }
  EXPECT_THROW(map.set("dense(", {{"model"}}), ValueError);  // invalid regex
  EXPECT_THROW(map.set("x", {{"batch"}}), ValueError);       // not a mesh axis
  EXPECT_THROW(map.set("", {{"model"}}), ValueError);
}

}  // namespace
}  // namespace kiln::distribute
