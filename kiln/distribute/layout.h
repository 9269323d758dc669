// DeviceMesh and LayoutMap: how variables are laid out over devices for model
// parallelism (Keras 3's keras.distribution.DeviceMesh / LayoutMap). The
// first pieces of issue 13; ModelParallel, which creates only a rank's shards
// through the VariableFactory seam, builds on them.
//
//   DeviceMesh mesh({2, 4}, {"batch", "model"});            // 8 devices, ranks 0..7 row-major
//   LayoutMap map(mesh);
//   map.set("dense.*kernel", {"", "model"});                 // column-parallel Dense kernels
//   map.set("dense.*bias", {"model"});
//   map.get("sequential/dense_1/kernel")->axes;              // {"", "model"}
//   mesh.shard_shape({784, 1024}, {{"", "model"}});          // {784, 256}
//
// LayoutMap lookup is Keras's: an exact key first; otherwise every key is a
// regular expression searched for in the path (ECMAScript syntax, as
// std::regex; Keras uses Python's re.search); more than one match is a
// ValueError naming the path and the keys; none gives nullopt (replicated).
// Keys may also name layer outputs ("dense_1/output").
//
// Thread safety: read-only after set(); set() must not race with get().
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/shape.h"
#include "kiln/core/variable.h"

namespace kiln::distribute {

class DeviceMesh {
 public:
  // `shape`: devices along each axis (each >= 1); `axis_names`: one unique,
  // non-empty name per axis; `devices`: "cpu:0", ... (default: one per rank,
  // "rank:<r>"), as many as the product of `shape`. ValueError otherwise.
  DeviceMesh(std::vector<int64_t> shape, std::vector<std::string> axis_names, std::vector<std::string> devices = {});

  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<std::string>& axis_names() const { return axis_names_; }
  const std::vector<std::string>& devices() const { return devices_; }
  int64_t size() const { return static_cast<int64_t>(devices_.size()); }
  // The index of an axis; ValueError naming the mesh's axes when unknown.
  int axis(const std::string& name) const;
  int64_t axis_size(const std::string& name) const { return shape_[axis(name)]; }
  // A rank's coordinate along each axis (row-major: the last axis varies fastest).
  std::vector<int64_t> coordinates(int64_t rank) const;

  // ValueError when `layout` does not fit a tensor of `shape` on this mesh:
  // more axes than dimensions, an unknown mesh axis, a mesh axis used twice,
  // or a dimension the axis size does not divide.
  void check(const Shape& shape, const TensorLayout& layout, const std::string& what) const;
  // The shape of each shard of a tensor of `shape` under `layout`.
  Shape shard_shape(const Shape& shape, const TensorLayout& layout) const;
  // The [begin, end) ranges of `rank`'s shard along each dimension.
  std::vector<std::pair<int64_t, int64_t>> shard_ranges(const Shape& shape, const TensorLayout& layout,
                                                        int64_t rank) const;

 private:
  std::vector<int64_t> shape_;
  std::vector<std::string> axis_names_;
  std::vector<std::string> devices_;
};

class LayoutMap {
 public:
  explicit LayoutMap(DeviceMesh mesh) : mesh_(std::move(mesh)) {}

  // Adds or replaces the layout for `key` (a path or a regex). ValueError
  // for an empty key, an invalid regex, or an axis the mesh does not have.
  void set(const std::string& key, TensorLayout layout);
  // Keras's lookup (see above).
  std::optional<TensorLayout> get(const std::string& path) const;
  // The keys in insertion order.
  std::vector<std::string> keys() const;
  const DeviceMesh& mesh() const { return mesh_; }

 private:
  DeviceMesh mesh_;
  std::vector<std::pair<std::string, TensorLayout>> entries_;  // insertion order
};

}  // namespace kiln::distribute
