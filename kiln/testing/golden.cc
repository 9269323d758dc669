#include "kiln/testing/golden.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "kiln/core/shape.h"
#include "kiln/testing/testing.h"

namespace kiln {

Json load_golden(const std::string& relative_path) { return read_json_file(source_path(relative_path)); }

bool write_or_expect_golden_configs(const Json& actual, const std::string& relative_path) {
  if (const char* path = std::getenv("KILN_WRITE_CONFIG_GOLDEN"); path && *path) {
    std::ofstream(path) << actual.dump(1) << "\n";
    return true;
  }
  const Json golden = load_golden(relative_path);
  for (auto it = actual.begin(); it != actual.end(); ++it) {
    if (!golden.contains(it.key())) {
      ADD_FAILURE() << it.key() << " has no golden config in " << relative_path;
      continue;
    }
    EXPECT_EQ(it.value().get<std::string>(), golden[it.key()].get<std::string>()) << it.key();
  }
  EXPECT_EQ(actual.size(), golden.size()) << relative_path << " holds configs the test no longer makes";
  return false;
}

at::Tensor golden_tensor(const Json& j) {
  if (j.is_null()) return {};
  const auto shape = j.at("shape").get<std::vector<int64_t>>();
  const std::string dtype = j.at("dtype").get<std::string>();
  const Json& data = j.at("data");
  if (dtype == "int64") {
    std::vector<int64_t> v = data.get<std::vector<int64_t>>();
    return at::tensor(v, at::kLong).reshape(shape);
  }
  std::vector<double> v = data.get<std::vector<double>>();
  at::Tensor t = at::tensor(v, at::kDouble).reshape(shape);
  return dtype == "float32" ? t.to(at::kFloat) : t;
}

::testing::AssertionResult tensors_close(const at::Tensor& actual, const at::Tensor& expected, double rtol,
                                         double atol) {
  auto shape_of = [](const at::Tensor& t) { return shape_to_string(Shape(t.sizes().begin(), t.sizes().end())); };
  if (!actual.defined() || !expected.defined())
    return ::testing::AssertionFailure() << "undefined tensor (actual defined: " << actual.defined()
                                         << ", expected defined: " << expected.defined() << ")";
  if (!actual.sizes().equals(expected.sizes()))
    return ::testing::AssertionFailure() << "shape " << shape_of(actual) << " != expected " << shape_of(expected);
  at::Tensor a = actual.detach().cpu().to(at::kDouble).reshape(-1);
  at::Tensor e = expected.detach().cpu().to(at::kDouble).reshape(-1);
  at::Tensor excess = (a - e).abs() - (atol + rtol * e.abs());
  if (a.numel() == 0 || excess.max().item<double>() <= 0) return ::testing::AssertionSuccess();
  const int64_t i = excess.argmax().item<int64_t>();
  std::ostringstream os;
  os.precision(9);
  os << "entry " << i << ": actual " << a[i].item<double>() << " vs expected " << e[i].item<double>() << " (rtol "
     << rtol << ", atol " << atol << ")";
  return ::testing::AssertionFailure() << os.str();
}

}  // namespace kiln
