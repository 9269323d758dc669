#include "kiln/distribute/layout.h"

#include <regex>
#include <set>

#include "kiln/core/error.h"

namespace kiln::distribute {
namespace {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (auto& x : v) s += (s.empty() ? "" : ", ") + ("'" + x + "'");
  return "[" + s + "]";
}

std::string dims(const std::vector<int64_t>& v) {
  std::string s;
  for (auto x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return "(" + s + ")";
}

}  // namespace

DeviceMesh::DeviceMesh(std::vector<int64_t> shape, std::vector<std::string> axis_names,
                       std::vector<std::string> devices)
    : shape_(std::move(shape)), axis_names_(std::move(axis_names)), devices_(std::move(devices)) {
  if (shape_.empty()) throw ValueError("DeviceMesh: `shape` needs at least one axis");
  if (shape_.size() != axis_names_.size())
    throw ValueError("DeviceMesh: `shape` " + dims(shape_) + " and `axis_names` " + join(axis_names_) +
                     " must have the same length");
  std::set<std::string> seen;
  int64_t n = 1;
  for (size_t i = 0; i < shape_.size(); ++i) {
    if (shape_[i] < 1) throw ValueError("DeviceMesh: every axis needs >= 1 device. Received shape " + dims(shape_));
    if (axis_names_[i].empty() || !seen.insert(axis_names_[i]).second)
      throw ValueError("DeviceMesh: axis names must be non-empty and unique. Received " + join(axis_names_));
    n *= shape_[i];
  }
  if (devices_.empty())
    for (int64_t r = 0; r < n; ++r) devices_.push_back("rank:" + std::to_string(r));
  if (static_cast<int64_t>(devices_.size()) != n)
    throw ValueError("DeviceMesh: shape " + dims(shape_) + " holds " + std::to_string(n) + " devices but " +
                     std::to_string(devices_.size()) + " were given");
}

int DeviceMesh::axis(const std::string& name) const {
  for (size_t i = 0; i < axis_names_.size(); ++i)
    if (axis_names_[i] == name) return static_cast<int>(i);
  throw ValueError("the device mesh has no axis '" + name + "'; its axes are " + join(axis_names_));
}

std::vector<int64_t> DeviceMesh::coordinates(int64_t rank) const {
  if (rank < 0 || rank >= size())
    throw ValueError("rank " + std::to_string(rank) + " is outside the device mesh of " + std::to_string(size()) +
                     " devices");
  std::vector<int64_t> c(shape_.size());
  for (size_t i = shape_.size(); i-- > 0;) {
    c[i] = rank % shape_[i];
    rank /= shape_[i];
  }
  return c;
}

void DeviceMesh::check(const Shape& shape, const TensorLayout& layout, const std::string& what) const {
  if (layout.axes.size() > shape.size())
    throw ValueError(what + ": layout " + join(layout.axes) + " has more axes than the tensor's " +
                     std::to_string(shape.size()) + " dimensions");
  std::set<std::string> used;
  for (size_t d = 0; d < layout.axes.size(); ++d) {
    const std::string& a = layout.axes[d];
    if (a.empty()) continue;
    const int64_t n = axis_size(a);
    if (!used.insert(a).second)
      throw ValueError(what + ": mesh axis '" + a + "' shards two dimensions; name it for one dimension and " +
                       "replicate the others (\"\" or null)");
    if (shape[d] % n != 0)
      throw ValueError(what + ": dimension " + std::to_string(d) + " of size " + std::to_string(shape[d]) +
                       " does not split evenly over mesh axis '" + a + "' (" + std::to_string(n) +
                       " devices); choose a size it divides, or replicate that dimension");
  }
}

Shape DeviceMesh::shard_shape(const Shape& shape, const TensorLayout& layout) const {
  check(shape, layout, "shard_shape");
  Shape s = shape;
  for (size_t d = 0; d < layout.axes.size(); ++d)
    if (!layout.axes[d].empty()) s[d] /= axis_size(layout.axes[d]);
  return s;
}

std::vector<std::pair<int64_t, int64_t>> DeviceMesh::shard_ranges(const Shape& shape, const TensorLayout& layout,
                                                                  int64_t rank) const {
  Shape s = shard_shape(shape, layout);
  const std::vector<int64_t> c = coordinates(rank);
  std::vector<std::pair<int64_t, int64_t>> r;
  for (size_t d = 0; d < shape.size(); ++d) {
    const bool sharded = d < layout.axes.size() && !layout.axes[d].empty();
    const int64_t i = sharded ? c[axis(layout.axes[d])] : 0;
    r.emplace_back(i * s[d], (i + 1) * s[d]);
  }
  return r;
}

void LayoutMap::set(const std::string& key, TensorLayout layout) {
  if (key.empty()) throw ValueError("LayoutMap: a key must be a non-empty path or regular expression");
  try {
    std::regex check(key);
  } catch (const std::regex_error& e) {
    throw ValueError("LayoutMap: key '" + key + "' is not a valid regular expression (" + e.what() + ")");
  }
  for (auto& a : layout.axes)
    if (!a.empty()) mesh_.axis(a);  // ValueError for an unknown axis
  for (auto& [k, v] : entries_)
    if (k == key) {
      v = std::move(layout);
      return;
    }
  entries_.emplace_back(key, std::move(layout));
}

std::optional<TensorLayout> LayoutMap::get(const std::string& path) const {
  for (auto& [k, v] : entries_)
    if (k == path) return v;
  std::vector<std::string> matches;
  const TensorLayout* found = nullptr;
  for (auto& [k, v] : entries_)
    if (std::regex_search(path, std::regex(k))) {
      matches.push_back(k);
      found = &v;
    }
  if (matches.size() > 1)
    throw ValueError("Path '" + path + "' matches multiple layout specification keys: " + join(matches) +
                     ". Make sure each variable path matches at most one key of the LayoutMap");
  if (found) return *found;
  return std::nullopt;
}

std::vector<std::string> LayoutMap::keys() const {
  std::vector<std::string> k;
  for (auto& [key, v] : entries_) k.push_back(key);
  return k;
}

}  // namespace kiln::distribute
