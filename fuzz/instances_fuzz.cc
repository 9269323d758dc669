// Fuzzes one line of a JSON Lines batch-prediction input
// (kiln/batch/instances.cc, `kiln predict`): a bare value for a one-input
// model or {name: value} for several, nested lists of numbers checked against
// each input's dtype and shape. What parses must stack into a batch.
#include <cstdlib>

#include "fuzz/fuzz_util.h"
#include "kiln/batch/instances.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<std::vector<kiln::batch::InstanceInput>> signatures = {
      {{"x", at::kFloat, {kiln::kNone, 3}}},
      {{"image", at::kFloat, {2, 2}}, {"label", at::kLong, {}}, {"mask", at::kBool, {kiln::kNone}}},
  };
  const std::string line = kiln::fuzz::as_string(data, size);
  for (const auto& inputs : signatures) {
    kiln::fuzz::expect_kiln_errors_only([&] {
      kiln::batch::Instance instance = kiln::batch::parse_instance(line, inputs);
      if (instance.size() != inputs.size()) abort();
      if (!kiln::batch::same_shapes(instance, instance)) abort();
      kiln::Tensors batch = kiln::batch::stack_instances({&instance, &instance}, inputs);
      if (batch.size() != inputs.size()) abort();
      for (size_t i = 0; i < batch.size(); ++i)
        if (batch[i].size(0) != 2 || batch[i].scalar_type() != inputs[i].dtype) abort();
    });
  }
  return 0;
}
