#include "kiln/batch/instances.h"

#include <algorithm>

#include "kiln/core/error.h"
#include "kiln/core/json.h"
#include "kiln/core/json_limits.h"
#include "kiln/core/string_tensor.h"
#include "kiln/core/tensor_json.h"
#include "kiln/models/model.h"

namespace kiln::batch {
namespace {

InstanceValue to_value(const Json& v, const InstanceInput& input, const std::string& what) {
  if (is_string_dtype(input.dtype)) {
    NestedStrings n = json_to_strings(v, what);
    return {{}, std::move(n.values), std::move(n.shape)};
  }
  refuse_strings(v, input.dtype, what);
  NestedNumbers n = json_to_numbers(v, what);
  return {std::move(n.values), {}, std::move(n.shape)};
}

bool fits(const Shape& got, const Shape& want) {
  if (got.size() != want.size()) return false;
  for (size_t i = 0; i < got.size(); ++i)
    if (want[i] != kNone && want[i] != got[i]) return false;
  return true;
}

std::string names_of(const std::vector<InstanceInput>& inputs) {
  std::string s;
  for (auto& i : inputs) s += (s.empty() ? "'" : ", '") + i.name + "'";
  return s;
}

}  // namespace

std::vector<InstanceInput> instance_inputs(const models::Model& model) {
  auto shapes = model.input_shapes();
  auto dtypes = model.input_dtypes();
  auto names = model.input_names();
  std::vector<InstanceInput> out;
  for (size_t i = 0; i < shapes.size(); ++i)  // names as model_signatures() gives them
    out.push_back({i < names.size() ? names[i] : "inputs_" + std::to_string(i),
                   i < dtypes.size() ? dtypes[i] : at::kFloat,
                   shapes[i].empty() ? Shape{} : Shape(shapes[i].begin() + 1, shapes[i].end())});
  return out;
}

Instance parse_instance(const std::string& line, const std::vector<InstanceInput>& inputs) {
  Json j = parse_json(line, "the line");  // refuses more than kMaxJsonDepth levels
  if (j.is_object() && j.contains("inputs")) {
    if (j.size() != 1) throw ValueError("an object with \"inputs\" must have no other keys");
    j = Json(j["inputs"]);
  }
  std::vector<Json> raw(inputs.size());
  if (j.is_object() && !is_b64_object(j)) {
    for (auto& [k, v] : j.items()) {
      size_t i = 0;
      while (i < inputs.size() && inputs[i].name != k) ++i;
      if (i == inputs.size()) throw ValueError("unknown input '" + k + "'; the model's inputs are " + names_of(inputs));
      raw[i] = v;
    }
    for (size_t i = 0; i < inputs.size(); ++i)
      if (raw[i].is_null())
        throw ValueError("input '" + inputs[i].name + "' is missing; the model's inputs are " + names_of(inputs));
  } else if (j.is_array() || j.is_number() || j.is_string() || j.is_object()) {  // the object: {"b64": ...}
    if (inputs.size() != 1)
      throw ValueError("the model takes " + std::to_string(inputs.size()) + " inputs (" + names_of(inputs) +
                       "); send an object {\"<name>\": [...], ...}");
    raw[0] = j;
  } else {
    throw ValueError("an instance must be a list of numbers, a string or an object of named inputs. Received: " +
                     json_excerpt(j));
  }
  Instance out;
  for (size_t i = 0; i < inputs.size(); ++i) {
    InstanceValue v = to_value(raw[i], inputs[i], "input '" + inputs[i].name + "'");
    if (!fits(v.shape, inputs[i].shape)) {
      int64_t n = num_elements(inputs[i].shape);
      throw ShapeError("input '" + inputs[i].name + "' has shape " + shape_to_string(v.shape) +
                       " but the model expects " + shape_to_string(inputs[i].shape) +
                       (n > 0 ? " (" + std::to_string(n) + " values per instance)" : std::string()));
    }
    out.push_back(std::move(v));
  }
  return out;
}

bool same_shapes(const Instance& a, const Instance& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].shape != b[i].shape) return false;
  return true;
}

Tensors stack_instances(const std::vector<const Instance*>& batch, const std::vector<InstanceInput>& inputs) {
  const int64_t n = (int64_t)batch.size();
  Tensors x;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Shape shape = {n};
    shape.insert(shape.end(), (*batch[0])[i].shape.begin(), (*batch[0])[i].shape.end());
    if (is_string_dtype(inputs[i].dtype)) {
      std::vector<std::string> all;
      for (const Instance* inst : batch) all.insert(all.end(), (*inst)[i].strings.begin(), (*inst)[i].strings.end());
      x.push_back(strings::encode(all, shape));
      continue;
    }
    auto t = at::empty(shape, at::kDouble);
    double* p = t.data_ptr<double>();
    for (const Instance* inst : batch) p = std::copy((*inst)[i].data.begin(), (*inst)[i].data.end(), p);
    x.push_back(t.to(inputs[i].dtype));
  }
  return x;
}

}  // namespace kiln::batch
