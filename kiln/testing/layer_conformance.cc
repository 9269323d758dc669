#include "kiln/testing/layer_conformance.h"

#include <cmath>
#include <cstring>
#include <iostream>
#include <map>

#include "kiln/core/io.h"
#include "kiln/core/random.h"
#include "kiln/core/string_tensor.h"
#include "kiln/core/torch_compat.h"
#include "kiln/testing/testing.h"

namespace kiln {
namespace {

std::vector<Shape> with_unknown_batch(std::vector<Shape> shapes) {
  for (auto& s : shapes)
    if (!s.empty()) s[0] = kNone;
  return shapes;
}

// A copy of `layer` from its config with another dtype policy, unbuilt.
LayerPtr rebuild_with_policy(const Layer& layer, const std::string& policy) {
  Json j = layer.to_json();
  j.erase("build_config");
  j["config"]["dtype"] = policy;
  return layer_from_json(j);
}

Tensors cast_floating(const Tensors& ts, at::ScalarType dt) {
  Tensors out;
  for (auto& t : ts) out.push_back(at::isFloatingType(t.scalar_type()) ? t.to(dt) : t);
  return out;
}

void expect_same_outputs(const Tensors& a, const Tensors& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(sizes_of(a[i]), sizes_of(b[i])) << what << " (output " << i << ")";
    EXPECT_TRUE(at::equal(a[i], b[i])) << what << ": output " << i << " differs; max |diff| = "
                                       << (a[i].to(at::kDouble) - b[i].to(at::kDouble)).abs().max().item<double>();
  }
}

Tensors infer(Layer& layer, const Tensors& inputs) {
  at::NoGradGuard ng;
  return layer(inputs, /*training=*/false);
}

void note_skip(const LayerTestCase& c, const char* check, const std::string& reason) {
  std::cout << "[ SKIPPED  ] " << c.name << ": " << check << " (" << reason << ")\n";
}

// --- 1. shapes ----------------------------------------------------------------
void check_shapes(const LayerTestCase& c, Layer& layer, const Tensors& inputs, const Tensors& outputs) {
  SCOPED_TRACE("check: output shapes");
  ASSERT_EQ(outputs.size(), c.expected_output_shapes.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    EXPECT_EQ(shape_to_string(sizes_of(outputs[i])), shape_to_string(c.expected_output_shapes[i]))
        << "eager output " << i;
    if (at::isFloatingType(outputs[i].scalar_type())) {
      EXPECT_EQ(outputs[i].scalar_type(), at::kFloat) << "output " << i << " under the float32 policy";
    }
  }
  auto expected_sym = with_unknown_batch(c.expected_output_shapes);
  auto sym = layer.compute_output_shape(with_unknown_batch(c.input_shapes));
  ASSERT_EQ(sym.size(), expected_sym.size());
  for (size_t i = 0; i < sym.size(); ++i)
    EXPECT_EQ(shape_to_string(sym[i]), shape_to_string(expected_sym[i])) << "compute_output_shape " << i;

  // Symbolic application on keras Inputs, with a fresh layer.
  LayerPtr fresh = c.make();
  KerasTensors ins;
  for (size_t i = 0; i < c.input_shapes.size(); ++i)
    ins.push_back(layers::Input(Shape(c.input_shapes[i].begin() + 1, c.input_shapes[i].end()),
                                i < c.input_dtypes.size() ? c.input_dtypes[i] : inputs[i].scalar_type()));
  KerasTensors outs = (*fresh)(ins);
  ASSERT_EQ(outs.size(), expected_sym.size());
  for (size_t i = 0; i < outs.size(); ++i)
    EXPECT_EQ(shape_to_string(outs[i].shape), shape_to_string(expected_sym[i])) << "symbolic output " << i;
  EXPECT_TRUE(fresh->built()) << "a symbolic call must build the layer";
}

// --- 2. parameter counts --------------------------------------------------------
int64_t count(const std::vector<VariablePtr>& vs) {
  int64_t n = 0;
  for (auto& v : vs) n += v->value().numel();
  return n;
}

void check_params(const LayerTestCase& c, Layer& layer) {
  SCOPED_TRACE("check: parameter counts");
  EXPECT_EQ(count(layer.trainable_weights()), c.expected_trainable_params) << "trainable params";
  EXPECT_EQ(count(layer.non_trainable_weights()), c.expected_non_trainable_params) << "non-trainable params";
  EXPECT_EQ(layer.count_params(), c.expected_trainable_params + c.expected_non_trainable_params);
  std::map<std::string, int> paths;
  for (auto& v : layer.weights()) {
    EXPECT_EQ(v->path().rfind(layer.name() + "/", 0), 0u)
        << "variable path '" << v->path() << "' is not under the layer's name '" << layer.name() << "'";
    EXPECT_EQ(++paths[v->path()], 1) << "duplicate variable path " << v->path();
  }
  layer.set_trainable(false);
  EXPECT_TRUE(layer.trainable_weights().empty()) << "set_trainable(false) must freeze every weight";
  EXPECT_EQ(count(layer.non_trainable_weights()), layer.count_params());
  layer.set_trainable(true);
  EXPECT_EQ(count(layer.trainable_weights()), c.expected_trainable_params) << "after set_trainable(true)";
}

// --- 3. config round trip ---------------------------------------------------------
void check_config(const LayerTestCase& c, Layer& layer, const Tensors& inputs, const Tensors& outputs) {
  SCOPED_TRACE("check: config round trip");
  EXPECT_TRUE(LayerRegistry::contains(layer.class_name())) << layer.class_name() << " is not registered";
  Json j = layer.to_json();
  LayerPtr copy = layer_from_json(parse_json(j.dump(), "layer json"));
  ASSERT_TRUE(copy);
  EXPECT_EQ(copy->class_name(), layer.class_name());
  EXPECT_TRUE(copy->built()) << "build_config must rebuild the layer";
  EXPECT_EQ(copy->get_config().dump(2), layer.get_config().dump(2));
  EXPECT_EQ(copy->to_json().dump(), j.dump());
  copy->set_weights(layer.get_weights());
  expect_same_outputs(infer(*copy, inputs), outputs, "rebuilt layer with copied weights");

  // A config without build_config builds on first call, to the same shapes.
  Json unbuilt = j;
  unbuilt.erase("build_config");
  LayerPtr lazy = layer_from_json(unbuilt);
  EXPECT_FALSE(lazy->built());
  Tensors lazy_out = infer(*lazy, inputs);
  for (size_t i = 0; i < lazy_out.size() && i < outputs.size(); ++i)
    EXPECT_EQ(sizes_of(lazy_out[i]), sizes_of(outputs[i]));
  EXPECT_EQ(lazy->count_params(), layer.count_params());
}

// --- 4. save / load -----------------------------------------------------------------
void check_save_load(const LayerTestCase& c, Layer& layer, const Tensors& inputs, const Tensors& outputs) {
  SCOPED_TRACE("check: save/load round trip");
  TempDir dir;
  const std::string path = join_path(dir.path(), "weights.bin");
  save_layer_weights(layer, path);
  LayerPtr fresh = layer_from_json(layer.to_json());  // new random initial weights
  load_layer_weights(*fresh, path);
  auto a = fresh->weights(), b = layer.weights();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]->path(), b[i]->path());
    EXPECT_TRUE(at::equal(a[i]->value(), b[i]->value())) << a[i]->path();
  }
  expect_same_outputs(infer(*fresh, inputs), outputs, "reloaded layer");
}

// --- 5. gradients against finite differences ----------------------------------------
void check_gradients(const LayerTestCase& c, Layer& layer, const Tensors& inputs) {
  SCOPED_TRACE("check: float64 gradients vs finite differences");
  const bool check_inputs = c.skip_input_gradients.empty();
  const bool check_weights = c.skip_weight_gradients.empty();
  if (!check_inputs) note_skip(c, "input gradients", c.skip_input_gradients);
  if (!check_weights) note_skip(c, "weight gradients", c.skip_weight_gradients);
  if (!check_inputs && !check_weights) return;

  LayerPtr l64 = rebuild_with_policy(layer, "float64");
  Tensors xs = cast_floating(inputs, at::kDouble);
  for (auto& x : xs) x = x.clone();
  infer(*l64, xs);  // build
  for (auto& v : l64->weights())
    if (at::isFloatingType(v->dtype())) {
      EXPECT_EQ(v->dtype(), at::kDouble) << v->path() << " under float64";
    }

  std::vector<std::pair<std::string, at::Tensor>> targets;
  if (check_inputs)
    for (size_t i = 0; i < xs.size(); ++i)
      if (at::isFloatingType(xs[i].scalar_type())) {
        xs[i].set_requires_grad(true);
        targets.emplace_back("input " + std::to_string(i), xs[i]);
      }
  if (check_weights)
    for (auto& v : l64->trainable_weights()) targets.emplace_back(v->path(), v->value());
  if (targets.empty()) return;

  Tensors probe = infer(*l64, xs);
  Tensors proj;
  for (auto& o : probe) proj.push_back(at::randn(o.sizes(), o.options().dtype(at::kDouble)));
  auto objective = [&]() {
    Tensors outs = (*l64)(xs, /*training=*/false);
    at::Tensor total = at::zeros({}, at::kDouble);
    for (size_t i = 0; i < outs.size(); ++i) total = total + (outs[i].to(at::kDouble) * proj[i]).sum();
    return total;
  };
  at::Tensor loss = objective();
  std::vector<at::Tensor> wrt;
  for (auto& t : targets) wrt.push_back(t.second);
  auto grads = compat::grad({loss}, wrt);

  const double eps = 1e-6;
  for (size_t k = 0; k < targets.size(); ++k) {
    const std::string& what = targets[k].first;
    at::Tensor data = targets[k].second.detach();  // shares storage
    ASSERT_TRUE(data.is_contiguous()) << what;
    if (!grads[k].defined()) {
      ADD_FAILURE() << what << " receives no gradient (is it used in call()?)";
      continue;
    }
    at::Tensor g = grads[k].contiguous().view(-1);
    at::Tensor flat = data.view(-1);
    const int64_t n = flat.numel();
    const int64_t samples = std::min<int64_t>(n, c.grad_samples);
    at::Tensor idx = samples == n ? at::arange(n) : at::randperm(n).slice(0, 0, samples);
    for (int64_t s = 0; s < samples; ++s) {
      const int64_t i = idx[s].item<int64_t>();
      double plus, minus;
      {
        at::NoGradGuard ng;
        const double orig = flat[i].item<double>();
        flat[i].fill_(orig + eps);
        plus = objective().item<double>();
        flat[i].fill_(orig - eps);
        minus = objective().item<double>();
        flat[i].fill_(orig);
      }
      const double numeric = (plus - minus) / (2 * eps);
      const double analytic = g[i].item<double>();
      EXPECT_NEAR(numeric, analytic, c.grad_atol + c.grad_rtol * std::abs(analytic))
          << "d/d " << what << "[" << i << "]";
    }
  }
}

// --- 6. one training step ---------------------------------------------------------------
void check_training(const LayerTestCase& c, Layer& layer, const Tensors& inputs) {
  SCOPED_TRACE("check: one SGD step lowers the loss");
  if (!c.skip_training.empty()) return note_skip(c, "training step", c.skip_training);
  LayerPtr copy = layer_from_json(layer.to_json());
  copy->set_weights(layer.get_weights());
  auto vars = copy->trainable_weights();
  if (vars.empty()) return;  // nothing to train
  Tensors targets;
  {
    at::NoGradGuard ng;
    for (auto& o : (*copy)(inputs, false)) targets.push_back(at::randn(o.sizes(), o.options()));
  }
  const uint64_t seed = c.seed + 1;
  auto loss_fn = [&]() {
    set_random_seed(seed);  // same dropout masks in both forwards
    Tensors outs = (*copy)(inputs, /*training=*/true);
    at::Tensor loss = at::zeros({}, at::kFloat);
    for (size_t i = 0; i < outs.size(); ++i) loss = loss + (outs[i].to(at::kFloat) - targets[i]).square().mean();
    return loss + copy->regularization_loss();
  };
  at::Tensor loss0 = loss_fn();
  std::vector<at::Tensor> values;
  for (auto& v : vars) values.push_back(v->value());
  auto grads = compat::grad({loss0}, values);
  double norm2 = 0;
  for (size_t i = 0; i < grads.size(); ++i) {
    ASSERT_TRUE(grads[i].defined()) << vars[i]->path() << " receives no gradient";
    EXPECT_TRUE(at::isfinite(grads[i]).all().item<bool>()) << vars[i]->path() << " has a non-finite gradient";
    norm2 += grads[i].to(at::kDouble).square().sum().item<double>();
  }
  ASSERT_GT(norm2, 0.0) << "every gradient is zero";
  // A small step along -grad (normalised so the step size does not depend on
  // the gradient's scale) must lower a smooth loss.
  const double lr = 0.01 / std::max(1.0, std::sqrt(norm2));
  for (size_t i = 0; i < vars.size(); ++i) vars[i]->assign(vars[i]->value().detach() - lr * grads[i]);
  const double l0 = loss0.item<double>();
  const double l1 = loss_fn().item<double>();
  EXPECT_LT(l1, l0) << "loss before " << l0 << ", after one step " << l1;
}

// --- 7. mixed precision -----------------------------------------------------------------
void check_mixed(const LayerTestCase& c, Layer& layer, const Tensors& inputs, const Tensors& outputs) {
  SCOPED_TRACE("check: mixed_bfloat16");
  if (!c.skip_mixed_precision.empty()) return note_skip(c, "mixed precision", c.skip_mixed_precision);
  LayerPtr lm = rebuild_with_policy(layer, "mixed_bfloat16");
  EXPECT_EQ(lm->dtype_policy().name(), "mixed_bfloat16");
  infer(*lm, inputs);  // build
  for (auto& v : lm->weights())
    if (at::isFloatingType(v->dtype())) {
      EXPECT_EQ(v->dtype(), at::kFloat) << v->path() << " must stay float32";
    }
  lm->set_weights(layer.get_weights());
  Tensors outs = infer(*lm, inputs);
  ASSERT_EQ(outs.size(), outputs.size());
  for (size_t i = 0; i < outs.size(); ++i) {
    if (!at::isFloatingType(outputs[i].scalar_type())) continue;
    EXPECT_EQ(outs[i].scalar_type(), at::kBFloat16) << "output " << i;
    const double scale = 1.0 + outputs[i].abs().max().item<double>();
    const double diff = (outs[i].to(at::kFloat) - outputs[i]).abs().max().item<double>();
    EXPECT_LE(diff, c.mixed_tolerance * scale) << "output " << i << " far from the float32 layer's";
  }
  auto vars = lm->trainable_weights();
  if (vars.empty()) return;
  Tensors train_outs = (*lm)(inputs, /*training=*/false);
  at::Tensor loss = at::zeros({}, at::kFloat);
  for (auto& o : train_outs) loss = loss + o.to(at::kFloat).square().mean();
  std::vector<at::Tensor> values;
  for (auto& v : vars) values.push_back(v->value());
  auto grads = compat::grad({loss}, values);
  for (size_t i = 0; i < grads.size(); ++i) {
    ASSERT_TRUE(grads[i].defined()) << vars[i]->path() << " receives no gradient under mixed_bfloat16";
    EXPECT_EQ(grads[i].scalar_type(), at::kFloat) << vars[i]->path();
  }
}

// --- weights file -----------------------------------------------------------------------------
constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'W', 'T', '0', '1'};

template <class T>
void put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}
void put_string(std::string* out, const std::string& s) {
  put<uint32_t>(out, (uint32_t)s.size());
  out->append(s);
}

struct Reader {
  const std::string& data;
  const std::string& path;
  size_t pos = 0;
  void need(size_t n) {
    if (pos + n > data.size()) throw FormatError(path + ": truncated weights file at byte " + std::to_string(pos));
  }
  template <class T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, data.data() + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  std::string get_string() {
    auto n = get<uint32_t>();
    need(n);
    std::string s = data.substr(pos, n);
    pos += n;
    return s;
  }
};

}  // namespace

void save_layer_weights(const Layer& layer, const std::string& path) {
  std::string out(kMagic, sizeof(kMagic));
  auto ws = layer.weights();
  put<uint64_t>(&out, ws.size());
  for (auto& v : ws) {
    at::Tensor t = v->value().detach().contiguous().cpu();
    put_string(&out, v->path());
    put_string(&out, dtype_to_string(t.scalar_type()));
    put<uint32_t>(&out, (uint32_t)t.dim());
    for (auto d : t.sizes()) put<int64_t>(&out, d);
    const size_t nbytes = t.numel() * t.element_size();
    put<uint64_t>(&out, nbytes);
    out.append(static_cast<const char*>(t.data_ptr()), nbytes);
  }
  atomic_write_file(path, out);
}

void load_layer_weights(Layer& layer, const std::string& path) {
  const std::string data = read_file(path);
  if (data.size() < sizeof(kMagic) || data.compare(0, sizeof(kMagic), kMagic, sizeof(kMagic)) != 0)
    throw FormatError(path + " is not a kiln weights file");
  Reader r{data, path, sizeof(kMagic)};
  std::map<std::string, at::Tensor> tensors;
  const auto n = r.get<uint64_t>();
  for (uint64_t i = 0; i < n; ++i) {
    std::string name = r.get_string();
    at::ScalarType dt = dtype_from_string(r.get_string());
    std::vector<int64_t> shape(r.get<uint32_t>());
    for (auto& d : shape) d = r.get<int64_t>();
    at::Tensor t = at::empty(shape, at::TensorOptions().dtype(dt));
    const auto nbytes = r.get<uint64_t>();
    if (nbytes != (uint64_t)(t.numel() * t.element_size()))
      throw FormatError(path + ": tensor '" + name + "' has " + std::to_string(nbytes) + " bytes for shape " +
                        shape_to_string(shape));
    r.need(nbytes);
    if (nbytes) std::memcpy(t.data_ptr(), data.data() + r.pos, nbytes);
    r.pos += nbytes;
    tensors[name] = t;
  }
  for (auto& v : layer.weights()) {
    auto it = tensors.find(v->path());
    if (it == tensors.end()) throw NotFoundError(path + " has no weight '" + v->path() + "'");
    if (it->second.scalar_type() != v->dtype())
      throw FormatError(path + ": weight '" + v->path() + "' is " + dtype_to_string(it->second.scalar_type()) +
                        ", the layer's is " + dtype_to_string(v->dtype()));
    v->assign(it->second);  // ShapeError on a shape mismatch
  }
}

void PrintTo(const LayerTestCase& c, std::ostream* os) { *os << c.name; }

std::function<LayerPtr()> from_config(const std::string& class_name, const Json& config) {
  return [class_name, config]() { return LayerRegistry::create(class_name, config); };
}

Tensors make_test_inputs(const LayerTestCase& c) {
  set_random_seed(c.seed);
  Tensors inputs;
  for (size_t i = 0; i < c.input_shapes.size(); ++i) {
    at::ScalarType dt = i < c.input_dtypes.size() ? c.input_dtypes[i] : at::kFloat;
    if (is_string_dtype(dt)) {
      if (c.string_pool.empty()) throw ValueError("LayerTestCase '" + c.name + "': a string input needs string_pool");
      at::Tensor pick = at::randint(0, (int64_t)c.string_pool.size(), {num_elements(c.input_shapes[i])}, at::kLong);
      std::vector<std::string> values;
      for (int64_t k = 0; k < pick.numel(); ++k) values.push_back(c.string_pool[pick[k].item<int64_t>()]);
      inputs.push_back(strings::encode(values, c.input_shapes[i]));
    } else if (at::isFloatingType(dt))
      inputs.push_back(at::randn(c.input_shapes[i], at::TensorOptions().dtype(dt)));
    else
      inputs.push_back(at::randint(0, c.int_input_high, c.input_shapes[i], at::TensorOptions().dtype(dt)));
  }
  return inputs;
}

void run_layer_test(const LayerTestCase& c) {
  SCOPED_TRACE("layer case: " + c.name);
  ASSERT_TRUE(c.make) << "LayerTestCase.make is not set";
  ASSERT_FALSE(c.input_shapes.empty()) << "LayerTestCase.input_shapes is empty";
  Tensors inputs = make_test_inputs(c);
  LayerPtr layer = c.make();
  ASSERT_TRUE(layer);
  EXPECT_EQ(layer->dtype_policy().name(), "float32") << "cases run under the float32 policy";
  EXPECT_FALSE(layer->built()) << "make() must return an unbuilt layer";
  Tensors outputs = infer(*layer, inputs);
  EXPECT_TRUE(layer->built());

  check_shapes(c, *layer, inputs, outputs);
  check_params(c, *layer);
  check_config(c, *layer, inputs, outputs);
  check_save_load(c, *layer, inputs, outputs);
  check_gradients(c, *layer, inputs);
  check_training(c, *layer, inputs);
  check_mixed(c, *layer, inputs, outputs);
}

}  // namespace kiln
