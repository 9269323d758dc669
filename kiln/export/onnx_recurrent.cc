// ONNX exporters of the recurrent layers (ONNX LSTM / GRU / RNN),
// Bidirectional and TimeDistributed.
#include "kiln/export/onnx_graph.h"

#include <limits>
#include <map>

namespace kiln::exporter::onnx {
namespace {

// ONNX's name for a Keras activation inside LSTM/GRU/RNN.
std::string rnn_activation(const LayerCall& c, const std::string& act) {
  if (act == "tanh") return "Tanh";
  if (act == "sigmoid") return "Sigmoid";
  if (act == "relu") return "Relu";
  c.refuse("uses activation '" + act + "' in its cell; ONNX's LSTM/GRU/RNN export supports tanh, sigmoid and relu");
}

// One direction's ONNX weights W (gates*units, features), R (gates*units,
// units), B (2*gates*units) and activations for one kiln recurrent layer.
struct RnnDirection {
  at::Tensor W, R, B;
  std::vector<std::string> activations;
  int64_t units;
};

RnnDirection rnn_direction(LayerCall& c, Layer& layer) {
  const std::string cls = layer.class_name();
  const Json cfg = layer.get_config();
  std::map<std::string, at::Tensor> w;
  for (auto& v : layer.weights()) {
    at::Tensor t = v->value().detach();
    if (is_16bit(c.compute)) t = t.to(c.compute);
    w[v->name()] = t.to(at::kFloat);
  }
  if (!w.count("kernel") || !w.count("recurrent_kernel"))
    throw StateError("export_onnx: " + c.where + " is not built; build the model first");
  RnnDirection d;
  d.units = cfg.at("units").get<int64_t>();
  const int64_t u = d.units;
  at::Tensor kernel = w.at("kernel"), rec = w.at("recurrent_kernel");
  at::Tensor bias = w.count("bias") ? w.at("bias") : at::Tensor();
  const std::string act = cfg.value("activation", "tanh");
  const std::string rec_act = cfg.value("recurrent_activation", "sigmoid");
  if (cls == "LSTM") {
    // Keras's gates i, f, c, o -> ONNX's i, o, f, c.
    auto order = [&](const at::Tensor& t) {
      auto g = t.split(u, -1);
      return at::cat({g[0], g[3], g[1], g[2]}, -1);
    };
    d.W = order(kernel).t();
    d.R = order(rec).t();
    at::Tensor wb = bias.defined() ? order(bias) : at::zeros({4 * u});
    d.B = at::cat({wb, at::zeros({4 * u})});
    d.activations = {rnn_activation(c, rec_act), rnn_activation(c, act), rnn_activation(c, act)};
  } else if (cls == "GRU") {
    // The same gate order z, r, h; reset_after is ONNX's linear_before_reset.
    d.W = kernel.t();
    d.R = rec.t();
    if (!bias.defined())
      d.B = at::zeros({6 * u});
    else if (bias.dim() == 2)
      d.B = at::cat({bias[0], bias[1]});
    else
      d.B = at::cat({bias, at::zeros({3 * u})});
    d.activations = {rnn_activation(c, rec_act), rnn_activation(c, act)};
  } else {
    d.W = kernel.t();
    d.R = rec.t();
    d.B = at::cat({bias.defined() ? bias : at::zeros({u}), at::zeros({u})});
    d.activations = {rnn_activation(c, act)};
  }
  d.W = d.W.contiguous();
  d.R = d.R.contiguous();
  return d;
}

bool is_recurrent(const std::string& cls) { return cls == "LSTM" || cls == "GRU" || cls == "SimpleRNN"; }

// Runs ONNX's LSTM/GRU/RNN over `x` (batch, time, features) for one layer
// ("forward") or two ("bidirectional"). `init`: initial states (batch,
// units) in kiln's order (per direction: h, then c for LSTM), or empty.
// Returns Y (time, dirs, batch, units), Y_h and, for LSTM, Y_c (dirs, batch, units).
std::vector<std::string> run_rnn(LayerCall& c, const std::vector<Layer*>& layers, const std::string& x,
                                 const std::vector<std::string>& init) {
  const std::string cls = layers[0]->class_name();
  const Json cfg = layers[0]->get_config();
  std::vector<RnnDirection> dirs;
  for (auto* l : layers) dirs.push_back(rnn_direction(c, *l));
  auto stack = [&](at::Tensor RnnDirection::*m) {
    std::vector<at::Tensor> t;
    for (auto& d : dirs) t.push_back(d.*m);
    return at::stack(t);
  };
  std::string seq = c.transpose(x, {1, 0, 2}, "_time_major");  // ONNX Runtime runs layout 0 only
  if (cfg.value("go_backwards", false) && layers.size() == 1)
    // Processed in reverse; kiln gives the outputs in that processed order.
    seq = c.slice(seq, {-1}, {std::numeric_limits<int64_t>::min()}, {0}, "_reversed", {-1});
  const int states = cls == "LSTM" ? 2 : 1;
  // ONNX's initial_h / initial_c are (dirs, batch, units).
  std::vector<std::string> initial(states, "");
  if (!init.empty()) {
    for (int s = 0; s < states; ++s) {
      std::vector<std::string> per_dir;
      for (size_t d = 0; d < layers.size(); ++d) per_dir.push_back(c.unsqueeze(init.at(d * states + s), {0}, "_init"));
      if (per_dir.size() == 1) {
        initial[s] = per_dir[0];
      } else {
        GraphBuilder::attr(c.node("Concat", per_dir, &initial[s], "_init"), "axis", (int64_t)0);
      }
    }
  }
  std::vector<std::string> ins = {seq,
                                  c.b.constant(c.base + "_W", stack(&RnnDirection::W)),
                                  c.b.constant(c.base + "_R", stack(&RnnDirection::R)),
                                  c.b.constant(c.base + "_B", stack(&RnnDirection::B)),
                                  "",
                                  initial[0]};
  if (cls == "LSTM") ins.push_back(initial[1]);
  while (!ins.empty() && ins.back().empty()) ins.pop_back();
  const std::string type = cls == "LSTM" ? "LSTM" : cls == "GRU" ? "GRU" : "RNN";
  auto* n = c.b.graph()->add_node();
  n->set_op_type(type);
  n->set_name(c.b.fresh(c.base + "_" + type));
  for (auto& i : ins) n->add_input(i);
  std::vector<std::string> outs = {c.b.fresh(c.base + "_Y"), c.b.fresh(c.base + "_Y_h")};
  if (cls == "LSTM") outs.push_back(c.b.fresh(c.base + "_Y_c"));
  for (auto& o : outs) n->add_output(o);
  GraphBuilder::attr(n, "hidden_size", dirs[0].units);
  GraphBuilder::attr(n, "direction", std::string(layers.size() == 2 ? "bidirectional" : "forward"));
  auto* a = n->add_attribute();
  a->set_name("activations");
  a->set_type(kiln_onnx::AttributeProto::STRINGS);
  for (auto& d : dirs)
    for (auto& s : d.activations) a->add_strings(s);
  if (cls == "GRU") GraphBuilder::attr(n, "linear_before_reset", (int64_t)(cfg.value("reset_after", true) ? 1 : 0));
  return outs;
}

void refuse_masked(LayerCall& c) {
  if (c.e.masked(c.x()))
    c.refuse(
        "receives a mask (from Embedding(mask_zero=true) or Masking): kiln skips masked steps anywhere in a "
        "sequence, which ONNX's LSTM/GRU/RNN (sequence_lens: trailing padding only) cannot express; export a model "
        "without the mask");
}

}  // namespace

std::vector<std::string> export_recurrent(LayerCall& c) {
  refuse_masked(c);
  std::vector<std::string> init(c.in.begin() + 1, c.in.end());
  auto outs = run_rnn(c, {&c.layer}, c.x(), init);
  std::vector<std::string> result;
  if (c.cfg.value("return_sequences", false))
    result.push_back(c.transpose(c.squeeze(outs[0], {1}, "_seq"), {1, 0, 2}, "_sequences"));
  else
    result.push_back(c.squeeze(outs[1], {0}, "_last"));
  if (c.cfg.value("return_state", false))
    for (size_t i = 1; i < outs.size(); ++i) result.push_back(c.squeeze(outs[i], {0}, "_state"));
  return result;
}

std::vector<std::string> export_bidirectional(LayerCall& c) {
  refuse_masked(c);
  auto subs = c.layer.sublayers();
  if (subs.size() != 2 || !is_recurrent(subs[0]->class_name())) c.refuse("does not wrap a recurrent layer");
  Layer& fwd = *subs[0];
  Layer& bwd = *subs[1];
  const Json fc = fwd.get_config(), bc = bwd.get_config();
  const bool sequences = fc.value("return_sequences", false), state = fc.value("return_state", false);
  const size_t n = fwd.class_name() == "LSTM" ? 2 : 1;
  std::vector<std::string> f_init, b_init;
  for (size_t i = 1; i < c.in.size(); ++i) (i <= n ? f_init : b_init).push_back(c.in[i]);
  // The two directions in one op when ONNX's "bidirectional" is kiln's pair:
  // same cell, forward then backward; otherwise two ops.
  auto comparable = [](Json j) {
    for (auto k : {"name", "go_backwards", "kernel_initializer", "recurrent_initializer", "bias_initializer", "seed"})
      j.erase(std::string(k));
    return j;
  };
  std::vector<std::string> of, ob;  // outputs, then states, per direction
  if (fwd.class_name() == bwd.class_name() && !fc.value("go_backwards", false) && bc.value("go_backwards", false) &&
      comparable(fc) == comparable(bc)) {
    std::vector<std::string> init = f_init;
    init.insert(init.end(), b_init.begin(), b_init.end());
    auto outs = run_rnn(c, {&fwd, &bwd}, c.x(), init);
    if (sequences) {
      // Y (time, 2, batch, units): ONNX gives the backward outputs in forward time order, as kiln's merge wants.
      auto y = c.transpose(outs[0], {1, 2, 0, 3}, "_dirs");  // (2, batch, time, units)
      of.push_back(c.squeeze(c.slice(y, {0}, {1}, {0}, "_fy"), {0}, "_f"));
      ob.push_back(c.squeeze(c.slice(y, {1}, {2}, {0}, "_by"), {0}, "_b"));
    } else {
      of.push_back(c.squeeze(c.slice(outs[1], {0}, {1}, {0}, "_fh"), {0}, "_f"));
      ob.push_back(c.squeeze(c.slice(outs[1], {1}, {2}, {0}, "_bh"), {0}, "_b"));
    }
    for (size_t i = 1; i < outs.size(); ++i) {
      of.push_back(c.squeeze(c.slice(outs[i], {0}, {1}, {0}, "_fs"), {0}, "_fstate"));
      ob.push_back(c.squeeze(c.slice(outs[i], {1}, {2}, {0}, "_bs"), {0}, "_bstate"));
    }
  } else {
    for (auto [layer, init, out] : {std::tuple{&fwd, &f_init, &of}, std::tuple{&bwd, &b_init, &ob}}) {
      auto outs = run_rnn(c, {layer}, c.x(), *init);
      out->push_back(sequences ? c.transpose(c.squeeze(outs[0], {1}, "_seq"), {1, 0, 2}, "_sequences")
                               : c.squeeze(outs[1], {0}, "_last"));
      for (size_t i = 1; i < outs.size(); ++i) out->push_back(c.squeeze(outs[i], {0}, "_state"));
    }
    if (sequences)  // kiln reverses the backward outputs to the forward time order
      ob[0] = c.slice(ob[0], {-1}, {std::numeric_limits<int64_t>::min()}, {1}, "_flip", {-1});
  }
  std::vector<std::string> result;
  const Json mode = c.cfg.value("merge_mode", Json("concat"));
  if (mode.is_null()) {
    result = {of[0], ob[0]};
  } else if (mode == "concat") {
    std::string y;
    GraphBuilder::attr(c.node("Concat", {of[0], ob[0]}, &y), "axis", (int64_t)-1);
    result.push_back(y);
  } else if (mode == "sum") {
    result.push_back(c.op("Add", {of[0], ob[0]}));
  } else if (mode == "mul") {
    result.push_back(c.op("Mul", {of[0], ob[0]}));
  } else {  // ave
    result.push_back(c.op("Div", {c.op("Add", {of[0], ob[0]}, "_sum"), c.scalar(c.base + "_two", 2.0f)}));
  }
  if (state) {
    result.insert(result.end(), of.begin() + 1, of.end());
    result.insert(result.end(), ob.begin() + 1, ob.end());
  }
  return result;
}

// TimeDistributed: time folded into the batch around the wrapped layer.
std::vector<std::string> export_time_distributed(LayerCall& c) {
  auto subs = c.layer.sublayers();
  if (subs.size() != 1) c.refuse("does not wrap one layer");
  auto shape = c.op("Shape", {c.x()}, "_shape");
  auto rest = c.slice(shape, {2}, {std::numeric_limits<int64_t>::max()}, {0}, "_rest");
  std::string folded_shape;
  GraphBuilder::attr(c.node("Concat", {c.b.ints(c.base + "_minus1", {-1}), rest}, &folded_shape, "_fshape"), "axis",
                     (int64_t)0);
  auto folded = c.op("Reshape", {c.x(), folded_shape}, "_folded");
  auto y = c.e.emit(*subs[0], {folded}).at(0);
  auto batch_time = c.slice(shape, {0}, {2}, {0}, "_bt");
  auto y_rest = c.slice(c.op("Shape", {y}, "_yshape"), {1}, {std::numeric_limits<int64_t>::max()}, {0}, "_yrest");
  std::string out_shape;
  GraphBuilder::attr(c.node("Concat", {batch_time, y_rest}, &out_shape, "_oshape"), "axis", (int64_t)0);
  return {c.op("Reshape", {y, out_shape})};
}

}  // namespace kiln::exporter::onnx
