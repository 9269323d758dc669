// Fuzzes the train spec (docs/SPEC.md; kiln/spec): top-level keys, the model
// section (built-in models, layer lists, Keras configs), compile, fit and
// callbacks. The data section is parsed by `kiln train` only to open files,
// so it is not fed to load_data here (the fuzzer would read arbitrary paths).
#include "fuzz/fuzz_util.h"
#include "kiln/spec/spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kiln::fuzz::expect_kiln_errors_only([&] {
    kiln::Json spec = kiln::spec::parse_spec(kiln::fuzz::as_string(data, size), "fuzz.json");
    if (!kiln::fuzz::numbers_at_most(spec, 4096)) return;
    kiln::fuzz::expect_kiln_errors_only([&] { kiln::spec::build_model(spec["model"], kiln::Shape{4}); });
    kiln::fuzz::expect_kiln_errors_only(
        [&] { kiln::spec::compile_args_from_spec(spec.contains("compile") ? spec["compile"] : kiln::Json()); });
    kiln::fuzz::expect_kiln_errors_only([&] {
      std::optional<uint64_t> seed;
      kiln::spec::fit_args_from_spec(spec.contains("fit") ? spec["fit"] : kiln::Json(), &seed);
    });
    kiln::fuzz::expect_kiln_errors_only(
        [&] { kiln::spec::callbacks_from_spec(spec.contains("callbacks") ? spec["callbacks"] : kiln::Json()); });
  });
  return 0;
}
