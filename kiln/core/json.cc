#include "kiln/core/json.h"

#include <fstream>
#include <sstream>

#include "kiln/core/error.h"
#include "kiln/core/io.h"

namespace kiln {

Json parse_json(const std::string& text, const std::string& what) {
  try {
    return Json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    std::string msg = e.what();
    // nlohmann prefixes "[json.exception.parse_error.101] "; keep the useful part.
    auto pos = msg.find("] ");
    if (pos != std::string::npos) msg = msg.substr(pos + 2);
    throw FormatError(what + " is not valid JSON: " + msg);
  }
}

Json read_json_file(const std::string& path) { return parse_json(read_file(path), path); }

const Json& require(const Json& j, const char* key, const std::string& owner) {
  if (!j.is_object() || !j.contains(key))
    throw ValueError(owner + " config is missing `" + key + "`");
  return j.at(key);
}

}  // namespace kiln
