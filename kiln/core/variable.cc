#include "kiln/core/variable.h"

#include <mutex>

#include "kiln/core/error.h"

namespace kiln {

bool TensorLayout::replicated() const {
  for (auto& a : axes)
    if (!a.empty()) return false;
  return true;
}

Variable::Variable(std::string path, at::Tensor value, bool trainable, TensorLayout layout,
                   std::optional<Shape> global_shape)
    : path_(std::move(path)), value_(std::move(value)), trainable_(trainable), layout_(std::move(layout)) {
  value_ = value_.detach();
  global_shape_ = global_shape.value_or(Shape(value_.sizes().begin(), value_.sizes().end()));
  value_.set_requires_grad(trainable_ && at::isFloatingType(value_.scalar_type()));
}

std::string Variable::name() const {
  auto pos = path_.rfind('/');
  return pos == std::string::npos ? path_ : path_.substr(pos + 1);
}

void Variable::set_trainable(bool t) {
  trainable_ = t;
  value_.set_requires_grad(t && at::isFloatingType(value_.scalar_type()));
}

Shape Variable::shape() const { return Shape(value_.sizes().begin(), value_.sizes().end()); }

void Variable::assign(const at::Tensor& v) {
  if (!v.sizes().equals(value_.sizes()))
    throw ShapeError("cannot assign to variable " + path_ + ": expected shape " + shape_to_string(shape()) +
                     ", received " + shape_to_string(Shape(v.sizes().begin(), v.sizes().end())));
  at::NoGradGuard ng;
  value_.copy_(v);
}

namespace {
std::mutex g_dist_mu;
std::shared_ptr<Distribution> g_dist;  // guarded by g_dist_mu
thread_local std::vector<std::string> t_scopes;
}  // namespace

void set_distribution(std::shared_ptr<Distribution> d) {
  std::lock_guard<std::mutex> l(g_dist_mu);
  g_dist = std::move(d);
}

std::shared_ptr<Distribution> distribution() {
  std::lock_guard<std::mutex> l(g_dist_mu);
  return g_dist;
}

std::vector<std::pair<int64_t, int64_t>> Distribution::variable_ranges(const Variable& v) const {
  std::vector<std::pair<int64_t, int64_t>> r;
  for (int64_t d : v.global_shape()) r.emplace_back(0, d);
  return r;
}

int num_replicas() {
  auto d = distribution();
  return d ? d->num_replicas() : 1;
}

int replica_id() {
  auto d = distribution();
  return d ? d->replica_id() : 0;
}

int process_index() {
  auto d = distribution();
  return d ? d->process_index() : 0;
}

NameScope::NameScope(const std::string& name) { t_scopes.push_back(name); }
NameScope::~NameScope() { t_scopes.pop_back(); }

std::string current_name_scope() {
  std::string s;
  for (auto& p : t_scopes) {
    if (p.empty()) continue;
    if (!s.empty()) s += "/";
    s += p;
  }
  return s;
}

VariablePtr VariableFactory::create(const VariableSpec& spec, const DTypePolicy& policy) {
  if (!spec.initializer) throw ValueError("variable '" + spec.name + "' needs an initializer");
  for (auto d : spec.shape)
    if (d < 0)
      throw ShapeError("variable '" + spec.name +
                       "' needs a fully known shape. Received: " + shape_to_string(spec.shape));
  const std::string scope = current_name_scope();
  const std::string path = scope.empty() ? spec.name : scope + "/" + spec.name;
  const at::ScalarType dtype = spec.dtype.value_or(policy.variable_dtype());
  at::Tensor init;
  {
    at::NoGradGuard ng;
    init = spec.initializer->sample(spec.shape, dtype).contiguous();
  }
  TensorLayout layout;
  if (auto dist = distribution()) {
    layout = dist->layout_for(path, spec.shape);
    init = dist->distribute_variable(init, layout);
  } else if (const at::Device device = default_device(); !device.is_cpu()) {
    // Drawn on the host (the same values on every device for one seed).
    init = init.to(device);
  }
  return std::make_shared<Variable>(path, init, spec.trainable, layout, spec.shape);
}

}  // namespace kiln
