// Runs a benchmark's Python peer (a script beside the benchmark's sources)
// on the torch kiln builds against and returns the JSON object it prints.
//
//   Json j = kiln::bench::run_python_peer("pytorch_mlp.py --epochs 3");
//
// The interpreter: $KILN_PYTHON, else the project's .venv (scripts/setup.sh),
// else python3; the scripts' folder: $KILN_BENCH_DIR, else bench/
// (benchmarks run from the repository root).
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "kiln/core/json.h"

namespace kiln::bench {

inline Json run_python_peer(const std::string& script_and_args) {
  const char* dir = std::getenv("KILN_BENCH_DIR");
  const char* py = std::getenv("KILN_PYTHON");
  const std::string python =
      py && *py ? py : (::access(".venv/bin/python", X_OK) == 0 ? ".venv/bin/python" : "python3");
  const std::string cmd = python + " " + std::string(dir ? dir : "bench") + "/" + script_and_args;
  FILE* f = ::popen(cmd.c_str(), "r");
  if (!f) throw std::runtime_error("cannot run " + cmd);
  std::string out;
  char buf[4096];
  size_t k;
  while ((k = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, k);
  if (::pclose(f) != 0) throw std::runtime_error("PyTorch peer failed: " + cmd + "\n" + out);
  const auto brace = out.find('{');
  if (brace == std::string::npos) throw std::runtime_error("PyTorch peer printed no JSON: " + cmd + "\n" + out);
  return parse_json(out.substr(brace), "PyTorch peer output");
}

}  // namespace kiln::bench
