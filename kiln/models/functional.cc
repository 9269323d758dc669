#include "kiln/models/functional.h"

#include <functional>
#include <map>
#include <set>

namespace kiln {

Functional::Functional(const KerasTensors& inputs, const KerasTensors& outputs, const std::string& name)
    : Model(name.empty() ? Json::object() : Json{{"name", name}}) {
  init(inputs, outputs);
}

void Functional::init(const KerasTensors& inputs, const KerasTensors& outputs) {
  if (inputs.empty() || outputs.empty())
    throw ValueError("Functional model needs at least one input and one output");
  inputs_ = inputs;
  outputs_ = outputs;
  std::set<Node*> input_nodes;
  for (auto& in : inputs) {
    if (!in.node || !std::dynamic_pointer_cast<InputLayer>(in.node->layer))
      throw ValueError("Functional model inputs must come from Input(); received '" + in.name() + "'");
    input_nodes.insert(in.node.get());
  }
  // Depth-first topological sort from the outputs back to the inputs.
  std::set<Node*> done, visiting;
  std::function<void(const std::shared_ptr<Node>&)> visit = [&](const std::shared_ptr<Node>& n) {
    if (done.count(n.get())) return;
    if (visiting.count(n.get())) throw ValueError("Functional model graph has a cycle at layer '" + n->layer->name() + "'");
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

std::vector<LayerPtr> Functional::layers() const { return layers_; }

std::vector<LayerPtr> Functional::sublayers() const {
  std::vector<LayerPtr> out;
  for (auto& l : layers_)
    if (!std::dynamic_pointer_cast<InputLayer>(l)) out.push_back(l);
  return out;
}

std::vector<Shape> Functional::input_shapes() const {
  std::vector<Shape> out;
  for (auto& in : inputs_) out.push_back(in.shape);
  return out;
}

std::vector<at::ScalarType> Functional::input_dtypes() const {
  std::vector<at::ScalarType> out;
  for (auto& in : inputs_) out.push_back(in.dtype);
  return out;
}

std::vector<std::string> Functional::input_names() const {
  std::vector<std::string> out;
  for (auto& in : inputs_) out.push_back(in.node->layer->name());
  return out;
}

std::vector<std::string> Functional::output_names() const {
  std::vector<std::string> out;
  for (auto& o : outputs_) out.push_back(o.node->layer->name() + (o.index ? "_" + std::to_string(o.index) : ""));
  return out;
}

Tensors Functional::call(const Tensors& inputs, bool training) {
  return call_masked(inputs, {}, training, nullptr);
}

Tensors Functional::call_masked(const Tensors& inputs, const Tensors& input_masks, bool training,
                                Tensors* output_masks) {
  if (inputs.size() != inputs_.size())
    throw ValueError("model '" + name() + "' expects " + std::to_string(inputs_.size()) + " inputs, received " +
                     std::to_string(inputs.size()));
  std::map<const Node*, Tensors> values;
  std::map<const Node*, Tensors> masks;  // beside values: each node's output masks (undefined = none)
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Shape& want = inputs_[i].shape;
    const auto got = inputs[i].sizes();
    bool ok = (int64_t)got.size() == (int64_t)want.size();
    for (size_t d = 1; ok && d < want.size(); ++d) ok = want[d] < 0 || want[d] == got[d];
    if (!ok)
      throw ShapeError("input '" + inputs_[i].node->layer->name() + "' of model '" + name() + "' expects shape " +
                       shape_to_string(want) + ", received " +
                       shape_to_string(Shape(got.begin(), got.end())));
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

std::vector<Shape> Functional::compute_output_shape(const std::vector<Shape>& input_shapes) {
  std::vector<Shape> out;
  for (auto& o : outputs_) out.push_back(o.shape);
  return out;
}

Json Functional::get_config() const {
  // Node index of each node within its layer's applications.
  std::map<const Node*, int> node_index;
  std::map<const Layer*, int> count;
  for (auto& n : nodes_) node_index[n.get()] = count[n->layer.get()]++;
  auto ref = [&](const KerasTensor& t) {
    return Json::array({t.node->layer->name(), node_index.at(t.node.get()), t.index});
  };
  Json layers = Json::array();
  std::map<const Layer*, size_t> pos;
  for (auto& n : nodes_) {
    const Layer* l = n->layer.get();
    if (!pos.count(l)) {
      Json lj;
      lj["class_name"] = n->layer->class_name();
      lj["config"] = n->layer->get_config();
      lj["name"] = n->layer->name();
      lj["inbound_nodes"] = Json::array();
      pos[l] = layers.size();
      layers.push_back(lj);
    }
    if (!n->inputs.empty()) {
      Json args = Json::array();
      for (auto& t : n->inputs) args.push_back(ref(t));
      layers[pos[l]]["inbound_nodes"].push_back(Json{{"args", args}});
    }
  }
  Json j = base_config();
  j["layers"] = layers;
  Json ins = Json::array(), outs = Json::array();
  for (auto& t : inputs_) ins.push_back(ref(t));
  for (auto& t : outputs_) outs.push_back(ref(t));
  j["input_layers"] = ins;
  j["output_layers"] = outs;
  return j;
}

namespace {
KerasTensors rebuild(const Json& config, KerasTensors* inputs_out) {
  std::map<std::string, LayerPtr> by_name;
  std::map<std::string, std::vector<KerasTensors>> applied;  // layer -> outputs per node
  // Layers are listed in topological order, so one pass suffices.
  for (auto& lj : require(config, "layers", "Functional")) {
    const std::string name = lj.at("name").get<std::string>();
    const std::string cls = lj.at("class_name").get<std::string>();
    if (cls == "InputLayer") {
      auto cfg = lj.at("config");
      Shape s;
      for (auto& d : cfg.at("batch_shape")) s.push_back(d.is_null() ? kNone : d.get<int64_t>());
      s.erase(s.begin());
      auto t = Input(s, dtype_from_string(cfg.value("dtype", "float32")), name);
      applied[name].push_back({t});
      continue;
    }
    auto layer = layer_from_json(Json{{"class_name", cls}, {"config", lj.at("config")}});
    by_name[name] = layer;
    for (auto& node : lj.value("inbound_nodes", Json::array())) {
      KerasTensors args;
      for (auto& r : node.at("args")) {
        const std::string src = r.at(0).get<std::string>();
        auto it = applied.find(src);
        if (it == applied.end() || r.at(1).get<size_t>() >= it->second.size())
          throw FormatError("Functional config: layer '" + name + "' refers to unknown node of '" + src + "'");
        args.push_back(it->second.at(r.at(1).get<size_t>()).at(r.at(2).get<size_t>()));
      }
      applied[name].push_back((*layer)(args));
    }
  }
  auto resolve = [&](const Json& r) {
    auto it = applied.find(r.at(0).get<std::string>());
    if (it == applied.end()) throw FormatError("Functional config refers to unknown layer " + r.dump());
    return it->second.at(r.at(1).get<size_t>()).at(r.at(2).get<size_t>());
  };
  for (auto& r : require(config, "input_layers", "Functional")) inputs_out->push_back(resolve(r));
  KerasTensors outs;
  for (auto& r : require(config, "output_layers", "Functional")) outs.push_back(resolve(r));
  return outs;
}
}  // namespace

Functional::Functional(const Json& config) : Model(config) {
  KerasTensors ins;
  KerasTensors outs = rebuild(config, &ins);
  init(ins, outs);
}

KILN_REGISTER_LAYER(Functional);

}  // namespace kiln
