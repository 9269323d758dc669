#include "kiln/models/functional.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "kiln/core/config_keys.h"
#include "kiln/core/json_limits.h"
#include "kiln/core/string_tensor.h"
#include "kiln/layers/sharded_kernel.h"
#include "kiln/models/model_json.h"

namespace kiln {

models::FunctionalImpl::FunctionalImpl(const KerasTensors& inputs, const KerasTensors& outputs, const std::string& name)
    : models::Model(name.empty() ? Json::object() : Json{{"name", name}}) {
  init(inputs, outputs);
}

void models::FunctionalImpl::init(const KerasTensors& inputs, const KerasTensors& outputs) {
  if (inputs.empty() || outputs.empty()) throw ValueError("Functional model needs at least one input and one output");
  inputs_ = inputs;
  outputs_ = outputs;
  std::set<Node*> input_nodes;
  for (auto& in : inputs) {
    if (!in.node || !std::dynamic_pointer_cast<layers::InputLayerImpl>(in.node->layer))
      throw ValueError("Functional model inputs must come from Input(); received '" + in.name() + "'");
    input_nodes.insert(in.node.get());
  }
  // Depth-first topological sort from the outputs back to the inputs.
  std::set<Node*> done, visiting;
  std::function<void(const std::shared_ptr<Node>&)> visit = [&](const std::shared_ptr<Node>& n) {
    if (done.count(n.get())) return;
    if (visiting.count(n.get()))
      throw ValueError("Functional model graph has a cycle at layer '" + n->layer->name() + "'");
    visiting.insert(n.get());
    if (n->inputs.empty() && !input_nodes.count(n.get()))
      throw ValueError("Functional model output depends on Input '" + n->layer->name() +
                       "' that is not among the model's inputs");
    for (auto& t : n->inputs) visit(t.node);
    visiting.erase(n.get());
    done.insert(n.get());
    nodes_.push_back(n);
  };
  for (auto& in : inputs) visit(in.node);
  for (auto& out : outputs) visit(out.node);
  std::set<Layer*> seen;
  std::set<std::string> names;
  for (auto& n : nodes_) {
    if (seen.insert(n->layer.get()).second) {
      if (!names.insert(n->layer->name()).second)
        throw ValueError("Functional model has two layers named '" + n->layer->name() + "'; names must be unique");
      layers_.push_back(n->layer);
    }
  }
  std::vector<Shape> shapes;
  for (auto& in : inputs) shapes.push_back(in.shape);
  // Layers were built while the graph was traced; the model counts as built.
  build_if_needed(shapes);
}

std::vector<LayerPtr> models::FunctionalImpl::layers() const { return layers_; }

std::vector<LayerPtr> models::FunctionalImpl::sublayers() const {
  std::vector<LayerPtr> out;
  for (auto& l : layers_)
    if (!std::dynamic_pointer_cast<layers::InputLayerImpl>(l)) out.push_back(l);
  return out;
}

std::vector<Shape> models::FunctionalImpl::input_shapes() const {
  std::vector<Shape> out;
  for (auto& in : inputs_) out.push_back(in.shape);
  return out;
}

std::vector<at::ScalarType> models::FunctionalImpl::input_dtypes() const {
  std::vector<at::ScalarType> out;
  for (auto& in : inputs_) out.push_back(in.dtype);
  return out;
}

std::vector<std::string> models::FunctionalImpl::input_names() const {
  std::vector<std::string> out;
  for (auto& in : inputs_) out.push_back(in.node->layer->name());
  return out;
}

std::vector<std::string> models::FunctionalImpl::output_names() const {
  std::vector<std::string> out;
  for (auto& o : outputs_) out.push_back(o.node->layer->name() + (o.index ? "_" + std::to_string(o.index) : ""));
  return out;
}

Tensors models::FunctionalImpl::call(const Tensors& inputs, bool training) {
  return call_masked(inputs, {}, training, nullptr);
}

Tensors models::FunctionalImpl::call_masked(const Tensors& inputs, const Tensors& input_masks, bool training,
                                            Tensors* output_masks) {
  if (inputs.size() != inputs_.size())
    throw ValueError("model '" + name() + "' expects " + std::to_string(inputs_.size()) + " inputs, received " +
                     std::to_string(inputs.size()));
  if (auto d = distribution(); d && d != planned_for_.lock()) {
    plan_sharded_layers();
    planned_for_ = d;
  }
  std::map<const Node*, Tensors> values;
  std::map<const Node*, Tensors> masks;  // beside values: each node's output masks (undefined = none)
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Shape& want = inputs_[i].shape;
    // A string input takes a string tensor of that logical shape (any row width).
    const bool text = is_string_dtype(inputs_[i].dtype);
    if (text && inputs[i].scalar_type() != string_storage_dtype)
      throw ValueError("input '" + inputs_[i].node->layer->name() + "' of model '" + name() +
                       "' takes strings: a string tensor (strings::encode). Received a " +
                       dtype_to_string(inputs[i].scalar_type()) + " tensor");
    const Shape got = text ? strings::logical_shape(inputs[i]) : sizes_of(inputs[i]);
    bool ok = (int64_t)got.size() == (int64_t)want.size();
    for (size_t d = 1; ok && d < want.size(); ++d) ok = want[d] < 0 || want[d] == got[d];
    if (!ok)
      throw ShapeError("input '" + inputs_[i].node->layer->name() + "' of model '" + name() + "' expects shape " +
                       shape_to_string(want) + ", received " + shape_to_string(got));
    values[inputs_[i].node.get()] = {inputs[i]};
    masks[inputs_[i].node.get()] = {i < input_masks.size() ? input_masks[i] : at::Tensor()};
  }
  for (auto& n : nodes_) {
    if (values.count(n.get())) continue;
    Tensors args, arg_masks;
    for (auto& t : n->inputs) {
      args.push_back(values.at(t.node.get()).at(t.index));
      arg_masks.push_back(masks.at(t.node.get()).at(t.index));
    }
    Tensors& m = masks[n.get()];
    values[n.get()] = n->layer->call_with_masks(args, arg_masks, training, &m);
  }
  Tensors out;
  for (auto& o : outputs_) out.push_back(values.at(o.node.get()).at(o.index));
  if (output_masks) {
    output_masks->clear();
    for (auto& o : outputs_) output_masks->push_back(masks.at(o.node.get()).at(o.index));
  }
  return out;
}

void models::FunctionalImpl::plan_sharded_layers() {
  std::map<const Node*, std::vector<const Node*>> consumers;
  for (auto& n : nodes_)
    for (auto& t : n->inputs) consumers[t.node.get()].push_back(n.get());
  std::set<const Node*> outputs;
  for (auto& o : outputs_) outputs.insert(o.node.get());
  std::map<Layer*, bool> keep;  // a shared layer keeps its output split only if every application may
  for (auto& n : nodes_) {
    KernelImpl* p = n->layer->kernel_impl_ptr();
    if (!p || !sharded_kernel(p)) continue;
    bool ok = may_keep_output_sharded(*n->layer) && !outputs.count(n.get()) && !consumers[n.get()].empty();
    std::vector<const Node*> frontier = consumers[n.get()];
    while (ok && !frontier.empty()) {
      const Node* c = frontier.back();
      frontier.pop_back();
      if (c->inputs.size() == 1 && passes_shards_through(*c->layer)) {
        ok = !outputs.count(c) && !consumers[c].empty();
        frontier.insert(frontier.end(), consumers[c].begin(), consumers[c].end());
      } else {
        ok = sharded_pair_fits(p, c->layer->kernel_impl_ptr());
      }
    }
    auto [it, fresh] = keep.emplace(n->layer.get(), ok);
    if (!fresh) it->second = it->second && ok;
  }
  for (auto& [layer, k] : keep) sharded_kernel(layer->kernel_impl_ptr())->keep_output_sharded(k);
}

std::vector<Shape> models::FunctionalImpl::compute_output_shape(const std::vector<Shape>& input_shapes) {
  std::vector<Shape> out;
  for (auto& o : outputs_) out.push_back(o.shape);
  return out;
}

// --- config writing (Keras 3's form) ------------------------------------------------------

namespace {

Json shape_json(const Shape& s) {
  Json d = Json::array();
  for (auto x : s) d.push_back(x < 0 ? Json(nullptr) : Json(x));
  return d;
}

// Keras numbers a nested Functional model's calls from 1: its node 0 is the
// one its own graph made when it was built.
size_t node_offset(const Layer* l) { return dynamic_cast<const models::FunctionalImpl*>(l) ? 1 : 0; }

}  // namespace

Json models::FunctionalImpl::get_config() const {
  // Node index of each node within its layer's applications in this model.
  std::map<const Node*, size_t> node_index;
  std::map<const Layer*, size_t> count;
  for (auto& n : nodes_) node_index[n.get()] = node_offset(n->layer.get()) + count[n->layer.get()]++;
  auto history = [&](const KerasTensor& t) {
    return Json::array({t.node->layer->name(), node_index.at(t.node.get()), t.index});
  };
  auto keras_tensor = [&](const KerasTensor& t) {
    return Json{
        {"class_name", "__keras_tensor__"},
        {"config",
         Json{{"shape", shape_json(t.shape)}, {"dtype", dtype_to_string(t.dtype)}, {"keras_history", history(t)}}}};
  };

  // Layers in Keras's order: deepest first (distance from the outputs), ties
  // in the order a depth-first walk from the outputs first meets them.
  std::set<const Node*> input_nodes, finished;
  for (auto& in : inputs_) input_nodes.insert(in.node.get());
  std::map<const Layer*, size_t> first_visit;
  std::vector<const Node*> post_order;
  std::function<void(const Node*)> walk = [&](const Node* n) {
    if (finished.count(n)) return;
    first_visit.emplace(n->layer.get(), first_visit.size());
    if (!input_nodes.count(n))
      for (auto& t : n->inputs) walk(t.node.get());
    finished.insert(n);
    post_order.push_back(n);
  };
  for (auto& o : outputs_) walk(o.node.get());
  std::map<const Node*, size_t> node_depth;
  std::map<const Layer*, size_t> layer_depth;
  for (auto it = post_order.rbegin(); it != post_order.rend(); ++it) {
    const Node* n = *it;
    size_t depth = std::max(node_depth[n], layer_depth[n->layer.get()]);
    layer_depth[n->layer.get()] = depth;
    node_depth[n] = depth;
    if (!input_nodes.count(n))
      for (auto& t : n->inputs) node_depth[t.node.get()] = std::max(node_depth[t.node.get()], depth + 1);
  }
  std::vector<LayerPtr> ordered = layers_;
  auto rank = [&](const LayerPtr& l) {
    auto v = first_visit.find(l.get());
    return v == first_visit.end() ? first_visit.size() : v->second;
  };
  std::stable_sort(ordered.begin(), ordered.end(), [&](const LayerPtr& a, const LayerPtr& b) {
    if (layer_depth[a.get()] != layer_depth[b.get()]) return layer_depth[a.get()] > layer_depth[b.get()];
    return rank(a) < rank(b);
  });

  Json layers = Json::array();
  for (auto& l : ordered) {
    Json entry = serialize_layer(*l);
    Json inbound = Json::array();
    for (auto& n : nodes_) {
      if (n->layer != l || n->inputs.empty()) continue;
      Json args = Json::array();
      if (n->inputs.size() == 1) {
        args.push_back(keras_tensor(n->inputs[0]));
      } else {  // a layer called on a list (merge layers)
        Json list = Json::array();
        for (auto& t : n->inputs) list.push_back(keras_tensor(t));
        args.push_back(list);
      }
      inbound.push_back(Json{{"args", args}, {"kwargs", Json::object()}});
    }
    entry["name"] = l->name();
    entry["inbound_nodes"] = inbound;
    layers.push_back(entry);
  }
  Json j;
  j["name"] = name();
  j["trainable"] = trainable();
  j["layers"] = layers;
  Json ins = Json::array(), outs = Json::array();
  for (auto& t : inputs_) ins.push_back(history(t));
  for (auto& t : outputs_) outs.push_back(history(t));
  j["input_layers"] = ins;
  j["output_layers"] = outs;
  return j;
}

// --- config reading ---------------------------------------------------------------------------
// Keras 3's form (inbound nodes {"args": [...], "kwargs": {...}} holding
// __keras_tensor__ objects, a list argument for merge layers), Keras 2's
// ([[layer, node, tensor, kwargs], ...]) and kiln's older one ({"args":
// [[layer, node, tensor], ...]}).

namespace {

struct TensorRef {
  std::string layer;
  size_t node = 0, tensor = 0;
};

std::string prefix(const Json& j) { return json_excerpt(j, 120); }

bool is_history(const Json& v) {
  if (!v.is_array() || (v.size() != 3 && v.size() != 4) || !v[0].is_string()) return false;
  return v[1].is_number_integer() && v[2].is_number_integer();
}

TensorRef parse_history(const Json& h, const std::string& where) {
  if (!is_history(h) || h[1].get<int64_t>() < 0 || h[2].get<int64_t>() < 0)
    throw FormatError(where +
                      ": a tensor reference must be [layer_name, node_index, tensor_index] with indices >= 0. "
                      "Received: " +
                      prefix(h));
  if (h.size() == 4 && !h[3].is_null() && !(h[3].is_object() && h[3].empty()))
    throw FormatError(where + ": call arguments other than tensors are not supported. Received: " + prefix(h[3]));
  return {h[0].get<std::string>(), h[1].get<size_t>(), h[2].get<size_t>()};
}

// The tensors a call argument holds, in order: a __keras_tensor__, a
// history triple, or lists of them.
void collect_refs(const Json& v, const std::string& where, std::vector<TensorRef>* out) {
  if (v.is_object() && v.value("class_name", "") == "__keras_tensor__") {
    check_config_keys(v, {"class_name", "config"}, where);
    const Json& c = require(v, "config", where);
    check_config_keys(c, {"shape", "dtype", "keras_history"}, where + " (__keras_tensor__ config)");
    out->push_back(parse_history(require(c, "keras_history", where), where));
  } else if (is_history(v)) {
    out->push_back(parse_history(v, where));
  } else if (v.is_array()) {
    for (auto& e : v) collect_refs(e, where, out);
  } else {
    throw FormatError(where +
                      ": expected a tensor reference [layer_name, node_index, tensor_index] or a "
                      "__keras_tensor__ (call arguments other than tensors are not supported). Received: " +
                      prefix(v));
  }
}

std::vector<TensorRef> node_refs(const Json& node, const std::string& where) {
  std::vector<TensorRef> refs;
  if (node.is_object()) {
    check_config_keys(node, {"args", "kwargs"}, where);
    collect_refs(require(node, "args", where), where, &refs);
    if (node.contains("kwargs") && !node["kwargs"].is_null()) {
      const Json& kw = node["kwargs"];
      if (!kw.is_object()) throw FormatError(where + ": `kwargs` must be an object. Received: " + prefix(kw));
      for (auto it = kw.begin(); it != kw.end(); ++it) {
        if (it.value().is_null()) continue;  // an optional argument left out (mask=None)
        try {
          collect_refs(it.value(), where, &refs);
        } catch (const FormatError&) {
          throw FormatError(where + ": call argument `" + it.key() + "`=" + prefix(it.value()) +
                            " is not supported; kiln layers take tensors only");
        }
      }
    }
  } else if (node.is_array()) {
    collect_refs(node, where, &refs);
  } else {
    throw FormatError(where + " must be {\"args\": [...], \"kwargs\": {...}}. Received: " + prefix(node));
  }
  if (refs.empty()) throw FormatError(where + " passes no tensor to the layer");
  return refs;
}

// input_layers / output_layers: a list of references, one reference, or a
// dict of them (Keras 3 writes a dict for dict inputs).
std::vector<TensorRef> io_refs(const Json& j, const std::string& where) {
  std::vector<TensorRef> refs;
  if (j.is_object() && !j.contains("class_name")) {
    for (auto it = j.begin(); it != j.end(); ++it) collect_refs(it.value(), where, &refs);
  } else {
    collect_refs(j, where, &refs);
  }
  if (refs.empty()) throw FormatError(where + " is empty; a model needs at least one");
  return refs;
}

struct LayerEntry {
  std::string name, class_name;
  Json config;
  std::vector<std::vector<TensorRef>> nodes;
};

LayerEntry parse_layer_entry(const Json& lj, size_t i) {
  std::string where = "Functional config: layers[" + std::to_string(i) + "]";
  if (!lj.is_object()) throw FormatError(where + " must be an object. Received: " + prefix(lj));
  check_config_keys(lj, {"module", "class_name", "config", "registered_name", "build_config", "name", "inbound_nodes"},
                    where);
  LayerEntry e;
  if (!lj.contains("class_name") || !lj["class_name"].is_string())
    throw FormatError(where + " needs a `class_name` string");
  e.class_name = lj["class_name"].get<std::string>();
  e.config = lj.value("config", Json::object());
  if (!e.config.is_object()) throw FormatError(where + ": `config` must be an object. Received: " + prefix(e.config));
  std::string cname =
      e.config.contains("name") && e.config["name"].is_string() ? e.config["name"].get<std::string>() : "";
  std::string ename = lj.contains("name") && lj["name"].is_string() ? lj["name"].get<std::string>() : "";
  if (!cname.empty() && !ename.empty() && cname != ename)
    throw FormatError(where + " is named '" + ename + "' but its config says '" + cname + "'");
  e.name = ename.empty() ? cname : ename;
  if (e.name.empty())
    throw FormatError(where + " (" + e.class_name + ") has no name; layers refer to each other by name");
  e.config["name"] = e.name;
  where += " ('" + e.name + "')";
  // The graph builds the layer; build_config's keys are still checked.
  if (lj.contains("build_config") && !lj["build_config"].is_null())
    check_config_keys(lj["build_config"], {"input_shape", "shapes_dict", "input_shapes"}, where + " build_config");
  const Json nodes = lj.value("inbound_nodes", Json::array());
  if (!nodes.is_array()) throw FormatError(where + ": `inbound_nodes` must be a list. Received: " + prefix(nodes));
  for (size_t k = 0; k < nodes.size(); ++k)
    e.nodes.push_back(node_refs(nodes[k], where + " inbound_nodes[" + std::to_string(k) + "]"));
  return e;
}

KerasTensor make_input(const LayerEntry& e) {
  if (!e.nodes.empty()) throw FormatError("Functional config: InputLayer '" + e.name + "' cannot have inbound nodes");
  layers::InputLayerImpl probe(e.config);  // validates the config (keys, shape, dtype)
  Shape s = probe.batch_shape();
  if (s.empty())
    throw FormatError("Functional config: InputLayer '" + e.name + "' needs a batch dimension in its shape");
  s.erase(s.begin());
  return layers::Input(s, probe.input_dtype(), e.name);
}

KerasTensors rebuild(const Json& config, KerasTensors* inputs_out) {
  const Json& layer_list = require(config, "layers", "Functional");
  if (!layer_list.is_array() || layer_list.empty())
    throw FormatError("Functional config: `layers` must be a non-empty list");
  struct Built {
    LayerEntry entry;
    LayerPtr layer;     // null for InputLayers
    size_t offset = 0;  // Keras's node numbering offset (nested Functional: 1)
    size_t next = 0;    // next inbound node to apply
  };
  std::vector<Built> built;
  std::map<std::string, size_t> index;
  std::map<std::string, std::vector<KerasTensors>> applied;  // layer -> outputs per node
  for (size_t i = 0; i < layer_list.size(); ++i) {
    Built b;
    b.entry = parse_layer_entry(layer_list[i], i);
    const std::string& name = b.entry.name;
    if (index.count(name)) throw FormatError("Functional config: two layers are named '" + name + "'");
    if (b.entry.class_name == "InputLayer") {
      applied[name].push_back({make_input(b.entry)});
    } else {
      b.layer = layer_from_json(Json{{"class_name", b.entry.class_name}, {"config", b.entry.config}});
      b.offset = node_offset(b.layer.get());
      applied[name];
    }
    index[name] = built.size();
    built.push_back(std::move(b));
  }
  auto node_count = [&](const std::string& layer) {
    const Built& b = built[index.at(layer)];
    return b.layer ? b.offset + b.entry.nodes.size() : 1;
  };
  auto describe = [&](const TensorRef& r) {
    return "[\"" + r.layer + "\", " + std::to_string(r.node) + ", " + std::to_string(r.tensor) + "]";
  };
  // A reference that can never resolve is an error now; one whose node is
  // not made yet waits (a shared layer's later call may use layers listed
  // after it, as Keras allows).
  for (auto& b : built)
    for (size_t k = 0; k < b.entry.nodes.size(); ++k)
      for (auto& r : b.entry.nodes[k]) {
        const std::string where =
            "Functional config: layer '" + b.entry.name + "' (inbound node " + std::to_string(k) + ")";
        if (!index.count(r.layer))
          throw FormatError(where + " refers to " + describe(r) + ", but there is no layer named '" + r.layer + "'");
        const size_t first = built[index.at(r.layer)].layer ? built[index.at(r.layer)].offset : 0;
        if (r.node < first || r.node >= node_count(r.layer))
          throw FormatError(where + " refers to " + describe(r) + ", but layer '" + r.layer + "' has nodes " +
                            std::to_string(first) + ".." + std::to_string(node_count(r.layer) - 1) +
                            " only; fix the node index");
      }
  auto lookup = [&](const TensorRef& r, const std::string& where) -> const KerasTensor* {
    const Built& src = built[index.at(r.layer)];
    const size_t k = r.node - (src.layer ? src.offset : 0);
    const auto& outs = applied.at(r.layer);
    if (k >= outs.size()) return nullptr;  // not made yet
    if (r.tensor >= outs[k].size())
      throw FormatError(where + " refers to " + describe(r) + ", but that node of '" + r.layer + "' has " +
                        std::to_string(outs[k].size()) + " output(s); fix the tensor index");
    return &outs[k][r.tensor];
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (auto& b : built) {
      while (b.layer && b.next < b.entry.nodes.size()) {
        const std::string where =
            "Functional config: layer '" + b.entry.name + "' (inbound node " + std::to_string(b.next) + ")";
        KerasTensors args;
        for (auto& r : b.entry.nodes[b.next]) {
          const KerasTensor* t = lookup(r, where);
          if (!t) break;
          args.push_back(*t);
        }
        if (args.size() != b.entry.nodes[b.next].size()) break;
        applied[b.entry.name].push_back((*b.layer)(args));
        ++b.next;
        progress = true;
      }
    }
  }
  for (auto& b : built)
    if (b.layer && b.next < b.entry.nodes.size())
      throw FormatError(
          "Functional config: inbound node " + std::to_string(b.next) + " of layer '" + b.entry.name +
          "' depends on itself through a cycle (or on a node that depends on it); the graph must be acyclic");
  auto resolve = [&](const Json& j, const char* key) {
    KerasTensors out;
    const std::string where = std::string("Functional config: `") + key + "`";
    for (auto& r : io_refs(require(j, key, "Functional"), where)) {
      if (!index.count(r.layer)) throw FormatError(where + " refers to unknown layer '" + r.layer + "'");
      const size_t first = built[index.at(r.layer)].layer ? built[index.at(r.layer)].offset : 0;
      if (r.node < first || r.node >= node_count(r.layer))
        throw FormatError(where + " refers to " + describe(r) + ", but layer '" + r.layer + "' has nodes " +
                          std::to_string(first) + ".." + std::to_string(node_count(r.layer) - 1) + " only");
      out.push_back(*lookup(r, where));
    }
    return out;
  };
  *inputs_out = resolve(config, "input_layers");
  return resolve(config, "output_layers");
}

}  // namespace

models::FunctionalImpl::FunctionalImpl(const Json& config) : models::Model(config) {
  check_config_keys(config, {"name", "trainable", "dtype", "layers", "input_layers", "output_layers"},
                    "the Functional config");
  KerasTensors ins;
  KerasTensors outs = rebuild(config, &ins);
  init(ins, outs);
}

KILN_REGISTER_LAYER_AS(Functional, models::FunctionalImpl);

}  // namespace kiln
