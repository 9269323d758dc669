// Which models the server serves: TF Serving's ModelServerConfig, read from
// its protobuf text format (read by libprotobuf's TextFormat into the
// generated tensorflow.serving.ModelServerConfig, then converted) or from JSON.
//
//   model_config_list {
//     config {
//       name: "mnist"  base_path: "/models/mnist"  model_platform: "kiln"
//       model_version_policy { latest { num_versions: 2 } }   # or all {} / specific { versions: 1 versions: 3 }
//       version_labels { key: "stable" value: 1 }
//       version_labels { key: "canary" value: 2 }
//     }
//   }
//
// JSON equivalent:
//   {"model_config_list": [{"name": "mnist", "base_path": "/models/mnist",
//     "model_platform": "kiln", "model_version_policy": {"latest": {"num_versions": 2}},
//     "version_labels": {"stable": 1, "canary": 2}}]}
//
// Parsers throw ValueError naming the file, line and column (text) or key
// (JSON) and what was expected; unknown fields are errors.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kiln/core/json.h"

namespace kiln::serving {

struct VersionPolicy {
  enum class Kind { kLatest, kAll, kSpecific };
  Kind kind = Kind::kLatest;
  int64_t num_versions = 1;       // kLatest
  std::vector<int64_t> versions;  // kSpecific
  // The versions to serve among those `available` on disk (any order in, ascending out).
  std::vector<int64_t> select(std::vector<int64_t> available) const;
  Json to_json() const;
};

struct ModelConfig {
  std::string name;
  std::string base_path;
  std::string model_platform = "kiln";
  VersionPolicy version_policy;
  std::map<std::string, int64_t> version_labels;
  // Name: [A-Za-z0-9_.-]+, not starting with '.', at most 256 chars; base_path non-empty.
  void validate() const;
  Json to_json() const;
};

struct ModelServerConfig {
  std::vector<ModelConfig> models;
  void validate() const;  // each model valid, names unique
  Json to_json() const;
};

bool is_valid_model_name(const std::string& name);

// `source` names the text in errors ("<source>: line L, column C: ...").
ModelServerConfig parse_model_config_text(const std::string& text, const std::string& source = "model config");
ModelServerConfig parse_model_config_json(const Json& j);
// By content: JSON if it starts with '{', else protobuf text format.
ModelServerConfig parse_model_config(const std::string& content, const std::string& source = "model config");
ModelServerConfig read_model_config_file(const std::string& path);

}  // namespace kiln::serving
