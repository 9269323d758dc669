// Typed options for layers built from C++: the pieces every layer's Options
// struct shares, and the checks that give typed options the same errors as a
// JSON config (ConfigReader's wording).
//
//   auto d = std::make_shared<Dense>(DenseOptions{.units = 64, .activation = "relu",
//                                                 .kernel_initializer = "he_normal",
//                                                 .base = {.name = "hidden"}});
//
// JSON stays at the registry/config boundary: a layer's JSON constructor
// reads its config into the Options struct (unknown keys are a ValueError
// naming the key) and constructs from it, so both paths validate alike and
// get_config() is the same for the same settings. options_from_config leaves
// `base` empty: the JSON constructor hands the config itself to Layer, which
// reads name, trainable and dtype (a Keras 3 DTypePolicy object included).
#pragma once

#include <string>
#include <vector>

#include "kiln/core/config_reader.h"
#include "kiln/core/initializers.h"
#include "kiln/core/json.h"

namespace kiln {

// Keras's base layer arguments.
struct LayerOptions {
  std::string name;       // empty: a unique name from the class name ("dense_1")
  bool trainable = true;  //
  std::string dtype;      // a dtype policy name ("float32", "mixed_float16"); empty: the global policy
};

// The base config Layer(const Json&) reads: {"name", "trainable", "dtype"}.
Json layer_base_config(const LayerOptions& o);

// An initializer by Keras name ("glorot_uniform", "he_normal", "zeros"; the
// aliases "uniform", "normal", "zero", "one" too) or as an object.
class InitializerArg {
 public:
  InitializerArg(const char* name) : name_(name) {}                // NOLINT(google-explicit-constructor)
  InitializerArg(std::string name) : name_(std::move(name)) {}     // NOLINT(google-explicit-constructor)
  InitializerArg(InitializerPtr init) : init_(std::move(init)) {}  // NOLINT(google-explicit-constructor)

  // The initializer; ValueError naming `owner` and `key` for an unknown name.
  InitializerPtr resolve(const std::string& owner, const char* key) const;
  // The initializer object, or null while only a name is held.
  const InitializerPtr& resolved() const { return init_; }

 private:
  std::string name_;
  InitializerPtr init_;
};

// Checks of typed options (the generic ones are in kiln/core/config_reader.h).
namespace option_check {
// A known activation name.
std::string activation(const std::string& owner, const char* key, const std::string& v);
}  // namespace option_check

}  // namespace kiln
