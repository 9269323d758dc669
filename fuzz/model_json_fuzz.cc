// Fuzzes model.json / keras.models.model_from_json (kiln/models/model_json.cc):
// Sequential and Functional configs in Keras 2 and Keras 3 forms, layer
// configs, inbound nodes, shared layers, nested models, compile_config. A
// model that loads must write a config that loads again (the round trip kiln
// promises with Keras).
#include <cstdlib>

#include "fuzz/fuzz_util.h"
#include "kiln/models/model.h"
#include "kiln/models/model_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kiln::fuzz::expect_kiln_errors_only([&] {
    kiln::Json j = kiln::parse_json(kiln::fuzz::as_string(data, size), "the model JSON");
    if (!kiln::fuzz::numbers_at_most(j, 4096)) return;
    kiln::ModelPtr model = kiln::model_from_json(j);
    kiln::Json written = kiln::model_to_json(*model);
    try {
      kiln::model_from_json(written);
    } catch (const kiln::Error& e) {
      fprintf(stderr, "a loaded model's own config does not load: %s\n%s\n", e.what(), written.dump().c_str());
      abort();
    }
  });
  return 0;
}
