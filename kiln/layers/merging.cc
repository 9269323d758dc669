#include "kiln/layers/merging.h"

#include "kiln/layers/config_fields.h"

namespace kiln {
namespace {

std::string shapes_text(const std::vector<Shape>& shapes) {
  std::string out;
  for (auto& s : shapes) out += (out.empty() ? "" : ", ") + shape_to_string(s);
  return out;
}

// Broadcast of two shapes with kNone for unknown sizes; nullopt if they clash.
std::optional<Shape> broadcast(const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t x = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t y = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (x == 1)
      out[i] = y;
    else if (y == 1)
      out[i] = x;
    else if (x < 0)
      out[i] = y;  // unknown: trust the known one (checked at call)
    else if (y < 0 || x == y)
      out[i] = x;
    else
      return std::nullopt;
  }
  return out;
}

}  // namespace

layers::ElementwiseMerge::ElementwiseMerge(const std::string& owner, const Json& config, Combine combine,
                                           size_t max_inputs,
                                           std::function<at::Tensor(const at::Tensor&, size_t)> finish)
    : Layer(config), owner_(owner), combine_(std::move(combine)), max_inputs_(max_inputs), finish_(std::move(finish)) {
  read_fields(config, owner, FieldTable<layers::MergeOptions>{});  // refuses any key but the base keys
}

std::vector<Shape> layers::ElementwiseMerge::compute_output_shape(const std::vector<Shape>& shapes) {
  if (shapes.size() < 2 || (max_inputs_ && shapes.size() > max_inputs_))
    throw ValueError(owner_ + " '" + name() + "' takes " +
                     (max_inputs_ == 2 ? std::string("exactly 2") : std::string("at least 2")) + " inputs. Received " +
                     std::to_string(shapes.size()));
  Shape out = shapes[0];
  for (size_t i = 1; i < shapes.size(); ++i) {
    auto b = broadcast(out, shapes[i]);
    if (!b || shapes[i].size() != shapes[0].size())
      throw ShapeError(owner_ + " '" + name() +
                       "': inputs must have the same rank and broadcastable shapes. "
                       "Received: " +
                       shapes_text(shapes));
    out = *b;
  }
  build_if_needed(shapes);
  return {out};
}

void layers::ElementwiseMerge::build(const std::vector<Shape>& input_shapes) {}

Tensors layers::ElementwiseMerge::call(const Tensors& inputs, bool training) {
  std::vector<Shape> shapes;
  for (auto& t : inputs) shapes.push_back(sizes_of(t));
  compute_output_shape(shapes);  // validates with a readable error
  at::Tensor y = inputs[0];
  for (size_t i = 1; i < inputs.size(); ++i) y = combine_(y, inputs[i]);
  if (finish_) y = finish_(y, inputs.size());
  return {y};
}

layers::AddImpl::AddImpl(const layers::MergeOptions& o) : layers::AddImpl(layer_base_config(o.base)) {}
layers::SubtractImpl::SubtractImpl(const layers::MergeOptions& o) : layers::SubtractImpl(layer_base_config(o.base)) {}
layers::MultiplyImpl::MultiplyImpl(const layers::MergeOptions& o) : layers::MultiplyImpl(layer_base_config(o.base)) {}
layers::AverageImpl::AverageImpl(const layers::MergeOptions& o) : layers::AverageImpl(layer_base_config(o.base)) {}
layers::MaximumImpl::MaximumImpl(const layers::MergeOptions& o) : layers::MaximumImpl(layer_base_config(o.base)) {}
layers::MinimumImpl::MinimumImpl(const layers::MergeOptions& o) : layers::MinimumImpl(layer_base_config(o.base)) {}

layers::AddImpl::AddImpl(const Json& c)
    : layers::ElementwiseMerge("Add", c, [](const at::Tensor& a, const at::Tensor& b) { return a + b; }) {}
layers::SubtractImpl::SubtractImpl(const Json& c)
    : layers::ElementwiseMerge(
          "Subtract", c, [](const at::Tensor& a, const at::Tensor& b) { return a - b; }, 2) {}
layers::MultiplyImpl::MultiplyImpl(const Json& c)
    : layers::ElementwiseMerge("Multiply", c, [](const at::Tensor& a, const at::Tensor& b) { return a * b; }) {}
layers::AverageImpl::AverageImpl(const Json& c)
    : layers::ElementwiseMerge(
          "Average", c, [](const at::Tensor& a, const at::Tensor& b) { return a + b; }, 0,
          [](const at::Tensor& s, size_t n) { return s / (double)n; }) {}
layers::MaximumImpl::MaximumImpl(const Json& c)
    : layers::ElementwiseMerge("Maximum", c,
                               [](const at::Tensor& a, const at::Tensor& b) { return at::maximum(a, b); }) {}
layers::MinimumImpl::MinimumImpl(const Json& c)
    : layers::ElementwiseMerge("Minimum", c,
                               [](const at::Tensor& a, const at::Tensor& b) { return at::minimum(a, b); }) {}

KILN_REGISTER_LAYER_AS(Add, layers::AddImpl);
KILN_REGISTER_LAYER_AS(Subtract, layers::SubtractImpl);
KILN_REGISTER_LAYER_AS(Multiply, layers::MultiplyImpl);
KILN_REGISTER_LAYER_AS(Average, layers::AverageImpl);
KILN_REGISTER_LAYER_AS(Maximum, layers::MaximumImpl);
KILN_REGISTER_LAYER_AS(Minimum, layers::MinimumImpl);

// --- Concatenate ----------------------------------------------------------------
namespace {
const FieldTable<layers::ConcatenateOptions>& concatenate_fields() {
  static const FieldTable<layers::ConcatenateOptions> t = {field("axis", &layers::ConcatenateOptions::axis)};
  return t;
}
}  // namespace

layers::ConcatenateOptions layers::ConcatenateImpl::options_from_config(const Json& config) {
  return read_fields(config, "Concatenate", concatenate_fields());
}

layers::ConcatenateImpl::ConcatenateImpl(const layers::ConcatenateOptions& o)
    : layers::ConcatenateImpl(o, layer_base_config(o.base)) {}

layers::ConcatenateImpl::ConcatenateImpl(const Json& config)
    : layers::ConcatenateImpl(options_from_config(config), config) {}

layers::ConcatenateImpl::ConcatenateImpl(const layers::ConcatenateOptions& o, const Json& base_config)
    : Layer(base_config), options_(o) {
  check_fields("Concatenate", options_, concatenate_fields());
}

layers::ConcatenateImpl::ConcatenateImpl(int64_t axis, const Json& extra)
    : layers::ConcatenateImpl(merged_config(extra, Json{{"axis", axis}})) {}

Shape layers::ConcatenateImpl::output_shape(const std::vector<Shape>& shapes) const {
  if (shapes.size() < 2)
    throw ValueError("Concatenate '" + name() + "' takes at least 2 inputs. Received " + std::to_string(shapes.size()));
  const int64_t rank = (int64_t)shapes[0].size();
  const int64_t axis = options_.axis < 0 ? options_.axis + rank : options_.axis;
  if (axis < 1 || axis >= rank)
    throw ValueError("Concatenate '" + name() + "': axis=" + std::to_string(options_.axis) +
                     " is not a non-batch axis of inputs of shape " + shape_to_string(shapes[0]));
  Shape out = shapes[0];
  for (size_t i = 1; i < shapes.size(); ++i) {
    const Shape& s = shapes[i];
    bool ok = (int64_t)s.size() == rank;
    for (int64_t d = 0; ok && d < rank; ++d) {
      if (d == axis) continue;
      if (s[d] >= 0 && out[d] >= 0 && s[d] != out[d]) ok = false;
      if (out[d] < 0) out[d] = s[d];
    }
    if (!ok)
      throw ShapeError("Concatenate '" + name() +
                       "': a Concatenate layer requires inputs with matching shapes "
                       "except for the concatenation axis " +
                       std::to_string(options_.axis) + ". Received: " + shapes_text(shapes));
    out[axis] = (out[axis] < 0 || s[axis] < 0) ? kNone : out[axis] + s[axis];
  }
  return out;
}

void layers::ConcatenateImpl::build(const std::vector<Shape>& input_shapes) { output_shape(input_shapes); }

Tensors layers::ConcatenateImpl::call(const Tensors& inputs, bool training) {
  std::vector<Shape> shapes;
  for (auto& t : inputs) shapes.push_back(sizes_of(t));
  output_shape(shapes);
  const int64_t axis = options_.axis < 0 ? options_.axis + inputs[0].dim() : options_.axis;
  return {at::cat(inputs, axis)};
}

std::vector<Shape> layers::ConcatenateImpl::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  return {output_shape(input_shapes)};
}

Json layers::ConcatenateImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, concatenate_fields());
  return j;
}

KILN_REGISTER_LAYER_AS(Concatenate, layers::ConcatenateImpl);

}  // namespace kiln
