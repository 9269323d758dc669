// Helpers shared by the subcommands.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "kiln/core/device.h"
#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "tools/kiln/cli.h"

namespace kiln::cli {

Json json_argument(const std::string& value, const std::string& option) {
  size_t first = value.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && (value[first] == '{' || value[first] == '['))
    return parse_json(value, option + " (inline JSON)");
  if (!path_exists(value))
    throw NotFoundError(option + " " + value +
                        ": no such file; give a JSON file or inline JSON such as '{\"source\": \"fashion_mnist\"}'");
  return read_json_file(value);
}

Json data_argument(const std::string& value, const std::string& option) {
  Json j = json_argument(value, option);
  if (j.is_object() && j.contains("data") && !j.contains("source")) return j["data"];
  return j;
}

std::string read_option_file(const std::string& path, const std::string& option) {
  std::ifstream in(path);
  if (!in) throw NotFoundError(option + ": file not found: " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

namespace {
bool g_device_flag = false;
}  // namespace

void apply_device_flag(const std::string& text) {
  const at::Device device = resolve_device(text, "--device");
  set_default_device(device);
  // "cuda" without an index stays so for the processes started: under
  // kiln launch each rank takes its own GPU (cuda:LOCAL_RANK).
  const bool unindexed = device.is_cuda() && text.find(':') == std::string::npos;
  ::setenv("KILN_DEVICE", unindexed ? "cuda" : device.str().c_str(), 1);
  g_device_flag = true;
}

bool device_flag_given() { return g_device_flag; }

CLI::Validator positive_integer() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        try {
          size_t used = 0;
          long long v = std::stoll(value, &used);
          if (used == value.size() && v > 0) return "";
        } catch (const std::exception&) {
        }
        return "must be a positive integer. Received: " + value;
      },
      "POSITIVE");
}

std::string format_metric(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4f", v);
  return buf;
}

void print_metrics(const std::map<std::string, double>& metrics, const std::string& prefix, std::ostream& os) {
  auto loss = metrics.find("loss");
  if (loss != metrics.end()) os << prefix << "loss: " << format_metric(loss->second) << "\n";
  for (auto& [name, value] : metrics)
    if (name != "loss") os << prefix << name << ": " << format_metric(value) << "\n";
}

}  // namespace kiln::cli
