#include "kiln/serving/core/warmup.h"

#include <sstream>

#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/serving/codec/rest_codec.h"

namespace kiln::serving {

int replay_warmup(Servable& servable, const std::string& version_dir) {
  const std::string path = version_dir + "/assets/extra/warmup_requests.jsonl";
  if (!path_exists(path)) return 0;
  // read_file refuses a FIFO or device at once: a version must not hang in
  // Loading on one (nor hold up the server's shutdown).
  std::istringstream in(read_file(path));
  std::string line;
  int n = 0, lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      Json body = parse_request_json(line, 64);
      PredictCall call = decode_predict_request(body, servable.signatures());
      servable.predict(call.inputs, call.signature_name);
    } catch (const std::exception& e) {
      throw FormatError("warmup request " + path + ":" + std::to_string(lineno) + " failed: " + e.what());
    }
    ++n;
  }
  return n;
}

}  // namespace kiln::serving
