#include "kiln/serving/model_config.h"

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "kiln/core/error.h"
#include "kiln/serving/text_format.h"

namespace kiln::serving {

std::vector<int64_t> VersionPolicy::select(std::vector<int64_t> available) const {
  std::sort(available.begin(), available.end());
  available.erase(std::unique(available.begin(), available.end()), available.end());
  std::vector<int64_t> out;
  switch (kind) {
    case Kind::kAll:
      return available;
    case Kind::kLatest: {
      int64_t n = std::max<int64_t>(1, num_versions);
      size_t from = available.size() > (size_t)n ? available.size() - n : 0;
      out.assign(available.begin() + from, available.end());
      return out;
    }
    case Kind::kSpecific:
      for (auto v : available)
        if (std::find(versions.begin(), versions.end(), v) != versions.end()) out.push_back(v);
      return out;
  }
  return out;
}

Json VersionPolicy::to_json() const {
  switch (kind) {
    case Kind::kAll:
      return Json{{"all", Json::object()}};
    case Kind::kLatest:
      return Json{{"latest", {{"num_versions", num_versions}}}};
    case Kind::kSpecific:
      return Json{{"specific", {{"versions", versions}}}};
  }
  return Json::object();
}

bool is_valid_model_name(const std::string& name) {
  if (name.empty() || name.size() > 256 || name[0] == '.') return false;
  for (char c : name)
    if (!(std::isalnum((unsigned char)c) || c == '_' || c == '-' || c == '.')) return false;
  return true;
}

void ModelConfig::validate() const {
  if (!is_valid_model_name(name))
    throw ValueError(
        "model config: invalid model name, expected letters, digits, '_', '-', '.' (not starting with "
        "'.'). Received: name=\"" +
        name + "\"");
  if (base_path.empty())
    throw ValueError("model config for '" + name + "': `base_path` is empty; set the model directory");
  if (version_policy.kind == VersionPolicy::Kind::kLatest && version_policy.num_versions < 1)
    throw ValueError("model config for '" + name +
                     "': `latest.num_versions` must be >= 1. Received: " + std::to_string(version_policy.num_versions));
  if (version_policy.kind == VersionPolicy::Kind::kSpecific && version_policy.versions.empty())
    throw ValueError("model config for '" + name + "': `specific` needs at least one `versions` entry");
  for (auto v : version_policy.versions)
    if (v < 1)
      throw ValueError("model config for '" + name +
                       "': versions are positive integers. Received: " + std::to_string(v));
  for (auto& [label, v] : version_labels) {
    if (label.empty() || !is_valid_model_name(label))
      throw ValueError("model config for '" + name + "': invalid version label \"" + label + "\"");
    if (v < 1)
      throw ValueError("model config for '" + name + "': label '" + label +
                       "' must name a positive version. Received: " + std::to_string(v));
  }
}

Json ModelConfig::to_json() const {
  Json labels = Json::object();
  for (auto& [k, v] : version_labels) labels[k] = v;
  return Json{{"name", name},
              {"base_path", base_path},
              {"model_platform", model_platform},
              {"model_version_policy", version_policy.to_json()},
              {"version_labels", labels}};
}

void ModelServerConfig::validate() const {
  std::set<std::string> seen;
  for (auto& m : models) {
    m.validate();
    if (!seen.insert(m.name).second) throw ValueError("model config: model '" + m.name + "' is listed twice");
  }
}

Json ModelServerConfig::to_json() const {
  Json list = Json::array();
  for (auto& m : models) list.push_back(m.to_json());
  return Json{{"model_config_list", list}};
}

namespace {

const char* kWhat = "model config";

VersionPolicy policy_from_text(const TextField& f) {
  VersionPolicy p;
  if (f.fields.size() != 1 || !f.fields[0].is_message)
    throw ValueError(std::string(kWhat) + ": line " + std::to_string(f.line) +
                     ": model_version_policy holds exactly one of latest {...}, all {}, specific {...}");
  const TextField& k = f.fields[0];
  if (k.name == "latest") {
    p.kind = VersionPolicy::Kind::kLatest;
    for (auto& g : k.fields)
      if (g.name == "num_versions")
        p.num_versions = g.as_int(kWhat);
      else
        throw ValueError(std::string(kWhat) + ": line " + std::to_string(g.line) + ": unknown field `" + g.name +
                         "` in latest");
  } else if (k.name == "all") {
    p.kind = VersionPolicy::Kind::kAll;
  } else if (k.name == "specific") {
    p.kind = VersionPolicy::Kind::kSpecific;
    for (auto& g : k.fields)
      if (g.name == "versions")
        p.versions.push_back(g.as_int(kWhat));
      else
        throw ValueError(std::string(kWhat) + ": line " + std::to_string(g.line) + ": unknown field `" + g.name +
                         "` in specific");
  } else {
    throw ValueError(std::string(kWhat) + ": line " + std::to_string(k.line) + ": unknown version policy `" + k.name +
                     "`; expected latest, all or specific");
  }
  return p;
}

ModelConfig model_from_text(const TextField& c) {
  ModelConfig m;
  for (auto& f : c.fields) {
    if (f.name == "name")
      m.name = f.as_string(kWhat);
    else if (f.name == "base_path")
      m.base_path = f.as_string(kWhat);
    else if (f.name == "model_platform")
      m.model_platform = f.as_string(kWhat);
    else if (f.name == "model_type")
      continue;  // deprecated in TF Serving; ignored
    else if (f.name == "model_version_policy")
      m.version_policy = policy_from_text(f);
    else if (f.name == "version_labels") {
      std::string key;
      int64_t value = 0;
      bool has_key = false, has_value = false;
      for (auto& g : f.fields) {
        if (g.name == "key")
          key = g.as_string(kWhat), has_key = true;
        else if (g.name == "value")
          value = g.as_int(kWhat), has_value = true;
      }
      if (!has_key || !has_value)
        throw ValueError(std::string(kWhat) + ": line " + std::to_string(f.line) +
                         ": version_labels needs key and value");
      m.version_labels[key] = value;
    } else if (f.name == "logging_config")
      continue;
    else
      throw ValueError(std::string(kWhat) + ": line " + std::to_string(f.line) + ": unknown field `" + f.name +
                       "` in config");
  }
  return m;
}

}  // namespace

ModelServerConfig parse_model_config_text(const std::string& text) {
  ModelServerConfig out;
  for (auto& top : parse_text_format(text, kWhat)) {
    if (top.name != "model_config_list" || !top.is_message)
      throw ValueError(std::string(kWhat) + ": line " + std::to_string(top.line) +
                       ": expected `model_config_list { ... }`, found `" + top.name + "`");
    for (auto& c : top.fields) {
      if (c.name != "config" || !c.is_message)
        throw ValueError(std::string(kWhat) + ": line " + std::to_string(c.line) +
                         ": expected `config { ... }`, found `" + c.name + "`");
      out.models.push_back(model_from_text(c));
    }
  }
  out.validate();
  return out;
}

ModelServerConfig parse_model_config_json(const Json& j) {
  ModelServerConfig out;
  if (!j.is_object() || !j.contains("model_config_list"))
    throw ValueError("model config JSON: expected {\"model_config_list\": [...]}");
  const Json& list = j["model_config_list"];
  const Json* arr = &list;
  if (list.is_object() && list.contains("config")) arr = &list["config"];  // proto-JSON style
  if (!arr->is_array()) throw ValueError("model config JSON: `model_config_list` must be a list of configs");
  try {
    for (auto& c : *arr) {
      ModelConfig m;
      m.name = c.at("name").get<std::string>();
      m.base_path = c.at("base_path").get<std::string>();
      if (c.contains("model_platform")) m.model_platform = c["model_platform"].get<std::string>();
      if (c.contains("model_version_policy")) {
        const Json& p = c["model_version_policy"];
        if (p.contains("latest")) {
          m.version_policy.kind = VersionPolicy::Kind::kLatest;
          m.version_policy.num_versions = p["latest"].value("num_versions", (int64_t)1);
        } else if (p.contains("all")) {
          m.version_policy.kind = VersionPolicy::Kind::kAll;
        } else if (p.contains("specific")) {
          m.version_policy.kind = VersionPolicy::Kind::kSpecific;
          for (auto& v : p["specific"].at("versions"))
            m.version_policy.versions.push_back(v.is_string() ? std::stoll(v.get<std::string>()) : v.get<int64_t>());
        } else {
          throw ValueError("model config JSON for '" + m.name +
                           "': model_version_policy holds latest, all or specific");
        }
      }
      if (c.contains("version_labels"))
        for (auto& [k, v] : c["version_labels"].items())
          m.version_labels[k] = v.is_string() ? std::stoll(v.get<std::string>()) : v.get<int64_t>();
      out.models.push_back(std::move(m));
    }
  } catch (const nlohmann::json::exception& e) {
    throw ValueError(std::string("model config JSON: ") + e.what());
  }
  out.validate();
  return out;
}

ModelServerConfig parse_model_config(const std::string& content) {
  size_t i = content.find_first_not_of(" \t\r\n");
  if (i != std::string::npos && content[i] == '{') return parse_model_config_json(parse_json(content, "model config"));
  return parse_model_config_text(content);
}

ModelServerConfig read_model_config_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw NotFoundError("model config file not found: " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_model_config(ss.str());
}

}  // namespace kiln::serving
