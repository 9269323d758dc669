#include "kiln/saving/sharded_weights.h"

#include <algorithm>
#include <map>

#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/core/json.h"
#include "kiln/saving/safetensors.h"

namespace kiln {
namespace {

using Ranges = std::vector<std::pair<int64_t, int64_t>>;

Ranges ranges_of(const Variable& v) {
  auto d = distribution();
  if (d) return d->variable_ranges(v);
  Ranges r;
  for (int64_t n : v.global_shape()) r.emplace_back(0, n);
  return r;
}

}  // namespace

void save_sharded_weights(const models::Model& model, const std::string& dir) {
  auto dist = distribution();
  const int me = process_index();
  const auto vars = model.weights();
  if (me == 0) {
    if (path_exists(join_path(dir, "index.json")))
      throw ValueError("save_sharded_weights: " + dir + " already holds a save; choose an empty directory");
    make_dirs(dir);
  }
  if (dist) dist->barrier();  // the directory exists for everyone
  NamedTensors pieces;
  Json ranges = Json::object();
  for (auto& v : vars) {
    const bool writes = v->sharded() ? replica_id() == 0 : me == 0;
    if (!writes) continue;
    pieces.emplace_back(v->path(), v->value().detach());
    Json r = Json::array();
    for (auto& [b, e] : ranges_of(*v)) r.push_back({b, e});
    ranges[v->path()] = r;
  }
  const std::string file = "weights-" + std::to_string(me) + ".safetensors";
  if (!pieces.empty())
    atomic_write_file(join_path(dir, file),
                      encode_safetensors(pieces, {{"format", "kiln.weight_shard"}, {"ranges", ranges.dump()}}));
  if (dist) dist->barrier();  // every piece is on disk
  if (me != 0) return;
  Json index;
  index["format"] = "kiln.sharded_weights";
  index["format_version"] = 1;
  Json variables = Json::object();
  for (auto& v : vars) {
    Json layout = Json::array();
    for (auto& a : v->layout().axes) layout.push_back(a.empty() ? Json(nullptr) : Json(a));
    variables[v->path()] = {{"shape", v->global_shape()}, {"dtype", dtype_to_string(v->dtype())}, {"layout", layout}};
  }
  index["variables"] = variables;
  Json files = Json::array();
  for (auto& name : list_directory(dir))
    if (name.rfind("weights-", 0) == 0 && name.size() > 12 && name.substr(name.size() - 12) == ".safetensors")
      files.push_back(name);
  index["files"] = files;
  atomic_write_file(join_path(dir, "index.json"), index.dump(1) + "\n");
}

void load_sharded_weights(models::Model& model, const std::string& dir) {
  const std::string index_path = join_path(dir, "index.json");
  if (!path_exists(index_path))
    throw FormatError(dir + " has no index.json: not a sharded-weights directory, or its save was interrupted");
  const Json index = Json::parse(read_file(index_path));
  if (index.value("format", "") != "kiln.sharded_weights")
    throw FormatError(index_path + " is not a kiln.sharded_weights index");
  // Every piece of every file, with its ranges in the whole variable.
  struct Piece {
    at::Tensor value;
    Ranges ranges;
  };
  std::map<std::string, std::vector<Piece>> pieces;
  for (auto& f : index.at("files")) {
    const std::string path = join_path(dir, f.get<std::string>());
    std::map<std::string, std::string> meta;
    NamedTensors tensors = load_safetensors(path, &meta);
    const Json ranges = Json::parse(meta["ranges"].empty() ? "{}" : meta["ranges"]);
    for (auto& [name, t] : tensors) {
      if (!ranges.contains(name)) throw FormatError(path + ": tensor '" + name + "' has no ranges in its metadata");
      Ranges r;
      for (auto& p : ranges[name]) r.emplace_back(p[0].get<int64_t>(), p[1].get<int64_t>());
      if (static_cast<int64_t>(r.size()) != t.dim()) throw FormatError(path + ": ranges of '" + name + "' do not fit");
      pieces[name].push_back({t, r});
    }
  }
  const Json& variables = index.at("variables");
  for (auto& v : model.weights()) {
    if (!variables.contains(v->path()))
      throw FormatError(index_path + " has no variable '" + v->path() + "' of model '" + model.name() + "'");
    const Shape shape = variables[v->path()].at("shape").get<Shape>();
    if (shape != v->global_shape())
      throw FormatError(index_path + ": variable '" + v->path() + "' has shape " + shape_to_string(shape) +
                        " but the model expects " + shape_to_string(v->global_shape()));
    const Ranges want = ranges_of(*v);
    at::Tensor local = at::empty(v->value().sizes(), v->value().options().requires_grad(false));
    int64_t covered = 0;
    for (const Piece& p : pieces[v->path()]) {
      // The overlap of the piece with this process's part, in both.
      at::Tensor src = p.value, dst = local;
      int64_t n = 1;
      for (size_t d = 0; d < want.size() && n > 0; ++d) {
        const int64_t lo = std::max(want[d].first, p.ranges[d].first),
                      hi = std::min(want[d].second, p.ranges[d].second);
        n *= std::max<int64_t>(hi - lo, 0);
        if (hi <= lo) break;
        src = src.narrow(static_cast<int64_t>(d), lo - p.ranges[d].first, hi - lo);
        dst = dst.narrow(static_cast<int64_t>(d), lo - want[d].first, hi - lo);
      }
      if (n == 0) continue;
      dst.copy_(src);
      covered += n;
    }
    if (covered != local.numel())
      throw FormatError(dir + ": the shards cover " + std::to_string(covered) + " of the " +
                        std::to_string(local.numel()) + " values of '" + v->path() +
                        "' this process needs (a shard file is missing or damaged)");
    v->assign(local);
  }
}

}  // namespace kiln
