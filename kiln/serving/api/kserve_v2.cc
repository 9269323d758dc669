#include "kiln/serving/api/kserve_v2.h"

#include <cstdlib>
#include <set>

#include "kiln/core/dtype.h"
#include "kiln/serving/codec/tensor_proto.h"

namespace kiln::serving::kserve_v2 {
namespace {

// The default signature, or INVALID_ARGUMENT naming the ones the model has.
const Json& default_signature(const Json& sigs) {
  if (!sigs.contains(kDefaultSignature)) {
    std::string known;
    for (auto& [k, v] : sigs.items()) known += (known.empty() ? "'" : ", '") + k + "'";
    throw ServingError(Code::kInvalidArgument, "Serving signature name: '" + std::string(kDefaultSignature) +
                                                   "' not found in signature def; the model has " + known);
  }
  return sigs[kDefaultSignature];
}

// The KServe datatype of a kiln dtype name; BYTES for one without a numeric type.
std::string datatype_of(const std::string& kiln_dtype) {
  try {
    return kserve_datatype(dtype_from_string(kiln_dtype));
  } catch (const std::exception&) {
    return "BYTES";
  }
}

std::vector<TensorMetadata> tensors(const Json& sig, const char* side) {
  std::vector<TensorMetadata> out;
  if (!sig.contains(side)) return out;
  for (auto& [name, info] : sig[side].items()) {
    TensorMetadata t;
    t.name = name;
    t.datatype = datatype_of(info.value("dtype", std::string("float32")));
    if (info.contains("shape"))
      for (auto& d : info["shape"]) t.shape.push_back(d.is_null() ? -1 : d.get<int64_t>());
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace

ModelSpec model_spec(const std::string& name, const std::string& version) {
  if (name.empty()) throw ServingError(Code::kInvalidArgument, "the model name is empty");
  ModelSpec spec;
  spec.name = name;
  if (!version.empty()) {
    char* end = nullptr;
    long long v = std::strtoll(version.c_str(), &end, 10);
    if (*end != '\0' || v <= 0)
      throw ServingError(Code::kInvalidArgument, "model version '" + version + "' is not a positive integer");
    spec.version = v;
  }
  return spec;
}

ModelMetadata model_metadata(const ServerCore& core, const ModelSpec& spec) {
  ServableHandlePtr h = core.get(spec);
  ModelMetadata m;
  m.name = h->model_name;
  m.version = h->version;
  for (auto& s : core.model_status({spec.name, spec.version, std::nullopt}))
    if (s.state == VersionState::kReady) m.versions.push_back(std::to_string(s.version));
  const Json& sig = default_signature(h->signatures());
  m.inputs = tensors(sig, "inputs");
  m.outputs = tensors(sig, "outputs");
  return m;
}

Json to_json(const ModelMetadata& m) {
  auto tensors = [](const std::vector<TensorMetadata>& ts) {
    Json out = Json::array();
    for (auto& t : ts) out.push_back(Json{{"name", t.name}, {"datatype", t.datatype}, {"shape", t.shape}});
    return out;
  };
  return Json{{"name", m.name},
              {"versions", m.versions},
              {"platform", m.platform},
              {"inputs", tensors(m.inputs)},
              {"outputs", tensors(m.outputs)}};
}

void check_input(const Json& signatures, const std::string& name, at::ScalarType dtype) {
  const Json& sig = default_signature(signatures);
  if (!sig.contains("inputs") || !sig["inputs"].contains(name))
    throw ServingError(Code::kInvalidArgument, "unknown input \"" + name + "\"");
  const std::string want_name = sig["inputs"][name].value("dtype", std::string("float32"));
  const std::string want = datatype_of(want_name);
  const std::string got = kserve_datatype(dtype);
  if (got != want)
    throw ServingError(Code::kInvalidArgument,
                       "input \"" + name + "\" has datatype " + got + "; the model expects " + want);
}

std::vector<std::string> output_names(const TensorMap& outputs, const std::vector<std::string>& requested) {
  std::vector<std::string> names;
  if (requested.empty()) {
    for (auto& [name, v] : outputs) names.push_back(name);
    return names;
  }
  std::set<std::string> seen;
  for (auto& r : requested) {
    if (!outputs.count(r)) {
      std::string known;
      for (auto& [name, v] : outputs) known += (known.empty() ? "\"" : ", \"") + name + "\"";
      throw ServingError(Code::kInvalidArgument, "unknown output \"" + r + "\"; the model outputs " + known);
    }
    if (seen.insert(r).second) names.push_back(r);
  }
  return names;
}

}  // namespace kiln::serving::kserve_v2
