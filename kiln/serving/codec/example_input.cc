#include "kiln/serving/codec/example_input.h"

#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/core/string_tensor.h"

namespace kiln::serving {

std::vector<at::Tensor> examples_to_tensors(const tensorflow::serving::Input& input,
                                            const std::vector<ExampleInputSpec>& specs) {
  const google::protobuf::RepeatedPtrField<tensorflow::Example>* examples = nullptr;
  const tensorflow::Example* context = nullptr;
  if (input.has_example_list()) {
    examples = &input.example_list().examples();
  } else if (input.has_example_list_with_context()) {
    examples = &input.example_list_with_context().examples();
    context = &input.example_list_with_context().context();
  } else {
    throw ValueError("the request's input holds no examples; set input.example_list.examples");
  }
  const int64_t n = examples->size();
  if (n == 0) throw ValueError("the request's input holds 0 examples; send at least one");
  std::vector<at::Tensor> out;
  for (auto& spec : specs) {
    const int64_t per = num_elements(spec.shape);
    if (per < 0)
      throw ValueError("input '" + spec.name + "' has shape " + shape_to_string(spec.shape) +
                       " with unknown dimensions; Classify/Regress need fully known input shapes (use Predict)");
    Shape shape = {n};
    shape.insert(shape.end(), spec.shape.begin(), spec.shape.end());
    const bool is_string = is_string_dtype(spec.dtype);
    std::vector<std::string> strs;  // a string input's values
    at::Tensor t = at::empty(is_string ? Shape{0} : shape, at::kDouble);
    double* p = t.data_ptr<double>();
    for (int64_t i = 0; i < n; ++i) {
      const auto& features = (*examples)[i].features().feature();
      auto it = features.find(spec.name);
      const tensorflow::Feature* f = nullptr;
      if (it != features.end())
        f = &it->second;
      else if (context) {
        auto c = context->features().feature().find(spec.name);
        if (c != context->features().feature().end()) f = &c->second;
      }
      const std::string where = "example " + std::to_string(i) + ", feature '" + spec.name + "'";
      if (!f) throw ValueError(where + " is missing; every example needs one feature per model input");
      int64_t got;
      if (is_string ? f->has_float_list() || f->has_int64_list() : f->has_bytes_list()) {
        throw ValueError(where + " is a " + (is_string ? "numeric list" : "bytes_list") + "; input '" + spec.name +
                         "' expects dtype " + dtype_to_string(spec.dtype) + ": send " +
                         (is_string ? "bytes_list" : "float_list or int64_list"));
      } else if (is_string) {
        got = f->has_bytes_list() ? f->bytes_list().value_size() : 0;
        if (got == per) strs.insert(strs.end(), f->bytes_list().value().begin(), f->bytes_list().value().end());
      } else if (f->has_float_list()) {
        got = f->float_list().value_size();
        if (got == per)
          for (auto v : f->float_list().value()) *p++ = v;
      } else if (f->has_int64_list()) {
        got = f->int64_list().value_size();
        if (got == per)
          for (auto v : f->int64_list().value()) *p++ = (double)v;
      } else {
        got = 0;
      }
      if (got != per)
        throw ValueError(where + " holds " + std::to_string(got) + " values but input '" + spec.name + "' of shape " +
                         shape_to_string(spec.shape) + " needs " + std::to_string(per));
    }
    out.push_back(is_string ? strings::encode(strs, shape) : t.to(spec.dtype));
  }
  return out;
}

}  // namespace kiln::serving
