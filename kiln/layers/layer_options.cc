#include "kiln/layers/layer_options.h"

#include "kiln/core/error.h"
#include "kiln/layers/config_reader.h"

namespace kiln {

Json layer_base_config(const LayerOptions& o) {
  Json j = Json::object();
  if (!o.name.empty()) j["name"] = o.name;
  if (!o.trainable) j["trainable"] = false;
  if (!o.dtype.empty()) j["dtype"] = o.dtype;
  return j;
}

InitializerPtr InitializerArg::resolve(const std::string& owner, const char* key) const {
  if (init_) return init_;
  // ConfigReader knows Keras's aliases and words the error.
  const Json config{{key, name_}};  // outlives the reader, which borrows it
  ConfigReader r(config, owner);
  return r.initializer(key, name_);
}

namespace option_check {

std::string activation(const std::string& owner, const char* key, const std::string& v) {
  const Json config{{key, v}};
  ConfigReader r(config, owner);
  return r.activation(key, v);
}

}  // namespace option_check
}  // namespace kiln
