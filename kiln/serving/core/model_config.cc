#include "kiln/serving/core/model_config.h"

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "kiln/core/error.h"
#include "kiln/serving/codec/text_proto.h"
#include "tensorflow_serving/config/model_server_config.pb.h"

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

namespace pb = google::protobuf;
using ParseInfoTree = pb::TextFormat::ParseInfoTree;
using PolicyProto = tensorflow::serving::FileSystemStoragePathSourceConfig::ServableVersionPolicy;

VersionPolicy policy_from_proto(const PolicyProto& p, ParseInfoTree* where, const std::string& source) {
  VersionPolicy out;
  switch (p.policy_choice_case()) {
    case PolicyProto::kLatest: {
      out.kind = VersionPolicy::Kind::kLatest;
      // proto3 has no presence: an absent num_versions means 1 (TF Serving's
      // default), a written 0 is an error (validate()).
      const auto* latest = where->GetTreeForNested(PolicyProto::descriptor()->FindFieldByName("latest"), -1);
      const auto* n = PolicyProto::Latest::descriptor()->FindFieldByName("num_versions");
      bool written = latest && latest->GetLocation(n, -1).line >= 0;
      out.num_versions = written ? p.latest().num_versions() : 1;
      break;
    }
    case PolicyProto::kAll:
      out.kind = VersionPolicy::Kind::kAll;
      break;
    case PolicyProto::kSpecific:
      out.kind = VersionPolicy::Kind::kSpecific;
      out.versions.assign(p.specific().versions().begin(), p.specific().versions().end());
      break;
    case PolicyProto::POLICY_CHOICE_NOT_SET:
      throw ValueError(source + ": model_version_policy holds exactly one of latest {...}, all {}, specific {...}");
  }
  return out;
}

}  // namespace

ModelServerConfig parse_model_config_text(const std::string& text, const std::string& source) {
  tensorflow::serving::ModelServerConfig proto;
  ParseInfoTree info;
  TextProtoOptions options;
  options.field_nouns[PolicyProto::descriptor()->full_name()] = "version policy";
  parse_text_proto(text, source, &proto, &info, options);
  if (proto.has_custom_model_config())
    throw ValueError(source + ": custom_model_config is not supported; list the models in model_config_list");
  const auto* list_field = proto.GetDescriptor()->FindFieldByName("model_config_list");
  const auto* config_field = proto.model_config_list().GetDescriptor()->FindFieldByName("config");
  const auto* policy_field = tensorflow::serving::ModelConfig::descriptor()->FindFieldByName("model_version_policy");
  ParseInfoTree* list_info = info.GetTreeForNested(list_field, -1);
  ModelServerConfig out;
  for (int i = 0; i < proto.model_config_list().config_size(); ++i) {
    const auto& c = proto.model_config_list().config(i);
    ModelConfig m;
    m.name = c.name();
    m.base_path = c.base_path();
    if (!c.model_platform().empty()) m.model_platform = c.model_platform();
    if (c.has_model_version_policy()) {
      ParseInfoTree* config_info = list_info ? list_info->GetTreeForNested(config_field, i) : nullptr;
      ParseInfoTree* policy_info = config_info ? config_info->GetTreeForNested(policy_field, -1) : nullptr;
      ParseInfoTree empty;
      m.version_policy = policy_from_proto(
          c.model_version_policy(), policy_info ? policy_info : &empty,
          config_info ? text_proto_location(source, config_info->GetLocation(policy_field, -1)) : source);
    }
    for (auto& [label, version] : c.version_labels()) m.version_labels[label] = version;
    out.models.push_back(std::move(m));
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

ModelServerConfig parse_model_config(const std::string& content, const std::string& source) {
  size_t i = content.find_first_not_of(" \t\r\n");
  if (i != std::string::npos && content[i] == '{') return parse_model_config_json(parse_json(content, source));
  return parse_model_config_text(content, source);
}

ModelServerConfig read_model_config_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw NotFoundError("model config file not found: " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_model_config(ss.str(), path);
}

}  // namespace kiln::serving
