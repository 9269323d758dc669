#include "kiln/layers/einsum_dense.h"

#include <algorithm>
#include <cctype>
#include <map>

#include "kiln/layers/config_fields.h"

namespace kiln {
namespace {

enum class Elide { kNone, kLeft, kRight };

struct ParsedEquation {
  std::string in, kernel, out;  // letters only
  Elide elide = Elide::kNone;
};

bool letters(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isalpha(c); });
}

ParsedEquation parse_equation(const std::string& owner, const std::string& eq) {
  auto bad = [&]() -> ValueError {
    return ValueError(owner + ": invalid einsum equation '" + eq +
                      "'. Equations must be in the form [X],[Y]->[Z], ...[X],[Y]->...[Z], or "
                      "[X]...,[Y]->[Z]..., with one letter per axis");
  };
  auto arrow = eq.find("->");
  if (arrow == std::string::npos) throw bad();
  std::string lhs = eq.substr(0, arrow), out = eq.substr(arrow + 2);
  auto comma = lhs.find(',');
  if (comma == std::string::npos || lhs.find(',', comma + 1) != std::string::npos) throw bad();
  ParsedEquation p;
  std::string in = lhs.substr(0, comma);
  p.kernel = lhs.substr(comma + 1);
  const std::string dots = "...";
  auto starts = [&](const std::string& s) { return s.rfind(dots, 0) == 0; };
  auto ends = [&](const std::string& s) { return s.size() >= 3 && s.compare(s.size() - 3, 3, dots) == 0; };
  if (starts(in) && starts(out)) {
    p.elide = Elide::kLeft;
    p.in = in.substr(3);
    p.out = out.substr(3);
  } else if (ends(in) && ends(out)) {
    p.elide = Elide::kRight;
    p.in = in.substr(0, in.size() - 3);
    p.out = out.substr(0, out.size() - 3);
    if (p.in.size() < 2) throw bad();
  } else {
    p.in = in;
    p.out = out;
  }
  if (!letters(p.in) || !letters(p.kernel) || !letters(p.out)) throw bad();
  return p;
}

size_t expected_partial_rank(const ParsedEquation& p) {
  return p.elide == Elide::kLeft ? p.out.size() : p.out.size() - 1;
}

}  // namespace

EinsumShapes analyze_einsum(const std::string& owner, const std::string& equation, const std::string& bias_axes,
                            const Shape& input_shape, const Shape& partial) {
  ParsedEquation p = parse_equation(owner, equation);
  const int64_t rank = (int64_t)input_shape.size();
  const int64_t elided = rank - (int64_t)p.in.size();
  if (elided < 0 || (p.elide == Elide::kNone && elided != 0) || (p.elide != Elide::kNone && elided < 1))
    throw ShapeError(owner + ": input of shape " + shape_to_string(input_shape) + " does not fit the equation '" +
                     equation + "'");
  if (partial.size() != expected_partial_rank(p))
    throw ValueError(owner + ": `output_shape` " + shape_to_string(partial) + " must have " +
                     std::to_string(expected_partial_rank(p)) + " entries for the equation '" + equation + "'");
  Shape full = {input_shape[0]};
  if (p.elide == Elide::kLeft) {
    for (int64_t i = 1; i < elided; ++i) full.push_back(input_shape[i]);
    full.insert(full.end(), partial.begin(), partial.end());
  } else {
    full.insert(full.end(), partial.begin(), partial.end());
    for (int64_t i = rank - elided; i < rank; ++i) full.push_back(input_shape[i]);
  }
  const int64_t offset = p.elide == Elide::kLeft ? elided : 0;
  std::map<char, int64_t> in_pos, out_pos;
  for (size_t i = 0; i < p.in.size(); ++i) in_pos[p.in[i]] = (int64_t)i + offset;
  for (size_t i = 0; i < p.out.size(); ++i) out_pos[p.out[i]] = (int64_t)i + offset;

  for (char c : p.out) {
    if (!in_pos.count(c) && p.kernel.find(c) == std::string::npos)
      throw ValueError(owner + ": dimension '" + std::string(1, c) + "' of the output '" + p.out +
                       "' appears in neither the input spec '" + p.in + "' nor the kernel spec '" + p.kernel + "'");
    if (!in_pos.count(c)) continue;
    int64_t din = input_shape[in_pos[c]], &dout = full[out_pos[c]];
    if (din >= 0 && dout >= 0 && din != dout && out_pos[c] != 0)
      throw ValueError(owner + ": input shape and output shape do not match at shared dimension '" + std::string(1, c) +
                       "'. Input shape is " + shape_to_string(input_shape) + ", and output shape is " +
                       shape_to_string(full));
    if (dout < 0) dout = din;
  }
  EinsumShapes r;
  r.full_output = full;
  for (char c : p.kernel) {
    int64_t d;
    if (in_pos.count(c))
      d = input_shape[in_pos[c]];
    else if (out_pos.count(c))
      d = full[out_pos[c]];
    else
      throw ValueError(owner + ": kernel dimension '" + std::string(1, c) +
                       "' appears in neither the input nor the output of '" + equation + "'");
    if (d < 1)
      throw ShapeError(owner + ": kernel dimension '" + std::string(1, c) + "' has unknown size for input " +
                       shape_to_string(input_shape));
    r.kernel.push_back(d);
  }
  if (!bias_axes.empty()) {
    size_t first = p.out.size();
    for (char c : bias_axes) first = std::min(first, p.out.find(c));
    for (size_t i = first; i < p.out.size(); ++i) {
      char c = p.out[i];
      int64_t d = bias_axes.find(c) != std::string::npos ? full[out_pos[c]] : 1;
      if (d < 1)
        throw ShapeError(owner + ": bias dimension '" + std::string(1, c) + "' has unknown size for input " +
                         shape_to_string(input_shape));
      r.bias.push_back(d);
    }
    if (p.elide != Elide::kLeft)
      for (int64_t i = 0; i < elided; ++i) r.bias.push_back(1);
  }
  return r;
}

namespace {
const FieldTable<layers::EinsumDenseOptions>& einsum_dense_fields() {
  using O = layers::EinsumDenseOptions;
  const char* const output_shape = "output_shape";
  const char* const expected = "a positive integer or a list of positive integers or nulls";
  static const FieldTable<O> t = [=] {
    FieldDef<O> bias_axes = field("bias_axes", &O::bias_axes);
    bias_axes.write = [](Json& j, const O& o) {
      j["bias_axes"] = o.bias_axes.empty() ? Json(nullptr) : Json(o.bias_axes);
    };
    return FieldTable<O>{FieldDef<O>{output_shape,
                                     [=](ConfigReader& r, O& o) {
                                       const Json* os = r.get(output_shape);
                                       if (!os) throw ValueError(r.owner() + ": the config is missing `output_shape`");
                                       const Json list = os->is_array() ? *os : Json::array({*os});
                                       o.output_shape.clear();
                                       for (auto& d : list) {
                                         if (!d.is_null() && !(d.is_number_integer() && d.get<int64_t>() >= 1))
                                           r.invalid(output_shape, expected);
                                         o.output_shape.push_back(d.is_null() ? kNone : d.get<int64_t>());
                                       }
                                     },
                                     [=](const std::string& owner, O& o) {
                                       for (auto d : o.output_shape)
                                         if (d != kNone && d < 1)
                                           option_check::invalid(owner, output_shape, expected,
                                                                 int_list_json(o.output_shape));
                                     },
                                     [=](Json& j, const O& o) { j[output_shape] = int_list_json(o.output_shape); }},
                         field("equation", &O::equation).required("e.g. \"ab,bc->ac\""),
                         field("activation", &O::activation).activation(),
                         bias_axes,
                         field("kernel_initializer", &O::kernel_initializer),
                         field("bias_initializer", &O::bias_initializer),
                         field("kernel_regularizer", &O::kernel_regularizer),
                         field("bias_regularizer", &O::bias_regularizer),
                         field("activity_regularizer", &O::activity_regularizer),
                         no_constraint<O>("kernel_constraint"),
                         no_constraint<O>("bias_constraint")};
  }();
  return t;
}
}  // namespace

layers::EinsumDenseOptions layers::EinsumDenseImpl::options_from_config(const Json& config) {
  return read_fields(config, "EinsumDense", einsum_dense_fields());
}

layers::EinsumDenseImpl::EinsumDenseImpl(const layers::EinsumDenseOptions& o)
    : layers::EinsumDenseImpl(o, layer_base_config(o.base)) {}

layers::EinsumDenseImpl::EinsumDenseImpl(const Json& config)
    : layers::EinsumDenseImpl(options_from_config(config), config) {}

layers::EinsumDenseImpl::EinsumDenseImpl(const layers::EinsumDenseOptions& o, const Json& base_config)
    : SimpleLayer(base_config), options_(o) {
  const std::string owner = "EinsumDense";
  check_fields(owner, options_, einsum_dense_fields());
  ParsedEquation p = parse_equation(owner, options_.equation);
  if (options_.output_shape.size() != expected_partial_rank(p))
    option_check::invalid(owner, "output_shape",
                          "a shape with " + std::to_string(expected_partial_rank(p)) +
                              " entries (the output spec without the batch axis) for equation '" + options_.equation +
                              "'",
                          int_list_json(options_.output_shape));
  for (char c : options_.bias_axes)
    if (p.out.find(c) == std::string::npos)
      option_check::invalid(owner, "bias_axes", "letters of the output spec '" + p.out + "'", options_.bias_axes);
  activation_ = get_activation(options_.activation);
  impl_ = float_einsum_impl(options_.equation);
}

layers::EinsumDenseImpl::EinsumDenseImpl(const std::string& equation, const Shape& output_shape,
                                         const std::string& bias_axes, const std::string& activation, const Json& extra)
    : layers::EinsumDenseImpl(
          merged_config(extra, Json{{"equation", equation},
                                    {"output_shape", int_list_json(output_shape)},
                                    {"bias_axes", bias_axes.empty() ? Json(nullptr) : Json(bias_axes)},
                                    {"activation", activation}})) {}

void layers::EinsumDenseImpl::build(const std::vector<Shape>& input_shapes) {
  auto s = analyze_einsum("EinsumDense '" + name() + "'", options_.equation, options_.bias_axes, input_shapes.at(0),
                          options_.output_shape);
  spec_ = kernel_spec(s.kernel);
  const layers::EinsumDenseOptions& o = options_;
  if (policy_keeps_float_kernel())
    kernel_ = add_weight("kernel", s.kernel, o.kernel_initializer.resolved(), true, o.kernel_regularizer);
  if (!s.bias.empty()) bias_ = add_weight("bias", s.bias, o.bias_initializer.resolved(), true, o.bias_regularizer);
  impl_ = build_kernel_impl(spec_);
}

KernelSpec layers::EinsumDenseImpl::kernel_spec(const Shape& kernel_shape) const {
  ParsedEquation p = parse_equation("EinsumDense", options_.equation);
  KernelSpec spec;
  spec.equation = options_.equation;
  spec.kernel_shape = kernel_shape;
  for (size_t j = 0; j < p.kernel.size(); ++j)
    if (p.out.find(p.kernel[j]) == std::string::npos) spec.kernel_reduced_axes.push_back(static_cast<int64_t>(j));
  const int64_t n = static_cast<int64_t>(p.in.size());
  for (int64_t i = 0; i < n; ++i)
    if (p.out.find(p.in[i]) == std::string::npos)
      spec.input_reduced_axes.push_back(p.elide == Elide::kLeft ? i - n : i);
  return spec;
}

void layers::EinsumDenseImpl::quantize(const std::string& mode) { quantize_kernel(mode, spec_, impl_, kernel_); }

at::Tensor layers::EinsumDenseImpl::call1(const at::Tensor& x, bool training) {
  const Shape xs = impl_->logical_input_shape(Shape(x.sizes().begin(), x.sizes().end()));
  // Validates the input against the built kernel with a readable error.
  auto s =
      analyze_einsum("EinsumDense '" + name() + "'", options_.equation, options_.bias_axes, xs, options_.output_shape);
  if (s.kernel != spec_.kernel_shape)
    throw ShapeError("EinsumDense '" + name() + "' was built for a kernel of shape " +
                     shape_to_string(spec_.kernel_shape) + "; input of shape " + shape_to_string(xs) + " needs " +
                     shape_to_string(s.kernel));
  at::Tensor y =
      impl_->apply_with_bias(x, kernel_ ? value(kernel_) : at::Tensor(), bias_ ? value(bias_) : at::Tensor(), training);
  y = activation_(y);
  if (options_.activity_regularizer && training) add_loss((*options_.activity_regularizer)(y));
  return y;
}

std::vector<Shape> layers::EinsumDenseImpl::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  return {analyze_einsum("EinsumDense '" + name() + "'", options_.equation, options_.bias_axes, input_shapes.at(0),
                         options_.output_shape)
              .full_output};
}

Json layers::EinsumDenseImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, einsum_dense_fields());
  return j;
}

KILN_REGISTER_LAYER_AS(EinsumDense, layers::EinsumDenseImpl);

}  // namespace kiln
