// ConfigReader: reads and validates a layer's config with Keras's messages.
//
//   ConfigReader r(config, "Dense");
//   units_ = r.positive_int("units");            // required key
//   use_bias_ = r.boolean("use_bias", true);     // optional, with Keras's default
//   r.finish();                                  // any key not read -> ValueError
//
// The generic kinds (sizes, numbers, strings, choices, tuples) and the
// messages come from config::Reader (kiln/core/config_reader.h); this reader
// adds the layer kinds: initializers, regularizers, activations and the
// weight-constraint keys. The base keys (name, trainable, dtype) are read by
// Layer itself and always accepted.
//
// Not thread-safe (one reader per constructor call); borrows `config`.
#pragma once

#include <string>
#include <vector>

#include "kiln/core/config_reader.h"
#include "kiln/core/initializers.h"
#include "kiln/core/json.h"
#include "kiln/layers/regularizers.h"

namespace kiln {

class ConfigReader : public config::Reader {
 public:
  ConfigReader(const Json& config, std::string owner);

  // A name ("glorot_uniform"; "uniform"/"normal" are Keras aliases) or
  // {"class_name", "config"}.
  InitializerPtr initializer(const char* key, const std::string& fallback);
  RegularizerPtr regularizer(const char* key);  // nullptr if absent
  // kiln has no weight constraints yet: accepts only null/absent.
  void no_constraint(const char* key);
  // A known activation name (see activations.h); null means "linear".
  std::string activation(const char* key, const std::string& fallback);
};

// `extra` (an object, or null) with the `typed` keys set over it: how the
// typed C++ constructors turn their arguments into a config.
Json merged_config(const Json& extra, const Json& typed);

// Helpers for get_config(): JSON forms of optional members.
Json regularizer_json(const RegularizerPtr& r);
Json int_list_json(const std::vector<int64_t>& v);

}  // namespace kiln
