// kiln's copies of public .proto files (proto/) against upstream's field
// numbers (proto/upstream_fields.json, docs/WIRE_COMPAT.md): walks what protoc
// compiled (the generated descriptor pool) and fails on any difference that
// proto/wire_compat_allow.json does not name with a reason. A different
// number, name, type, package or RPC type is never allow-listable.
#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "inference/grpc_predict_v2.pb.h"
#include "kiln/testing/testing.h"
#include "tensorboard/plugins/hparams/plugin_data.pb.h"
#include "tensorflow/core/protobuf/error_codes.pb.h"
#include "tensorflow/core/protobuf/meta_graph.pb.h"
#include "tensorflow/core/util/event.pb.h"
#include "tensorflow_serving/apis/get_model_status.pb.h"
#include "tensorflow_serving/apis/model_management.pb.h"
#include "tensorflow_serving/apis/prediction_service.pb.h"
#include "tensorflow_serving/config/model_server_config.pb.h"
#include "tensorflow_serving/config/ssl_config.pb.h"
#include "tensorflow_serving/servables/tensorflow/session_bundle_config.pb.h"

namespace kiln::serving::wire_compat_test {

namespace pb = google::protobuf;
using WireJson = nlohmann::json;

WireJson load_json(const std::string& relative) {
  std::ifstream in(source_path(relative));
  if (!in) throw std::runtime_error("cannot open " + source_path(relative));
  return WireJson::parse(in);
}

const WireJson& upstream() {
  static const WireJson j = load_json("proto/upstream_fields.json");
  return j;
}
const WireJson& allow() {
  static const WireJson j = load_json("proto/wire_compat_allow.json");
  return j;
}

// The generated pool; touching one type per header makes sure every linked
// file registered (the pool builds files lazily from what registered).
const pb::DescriptorPool* pool() {
  static const pb::DescriptorPool* p = [] {
    (void)inference::ModelInferRequest::descriptor();
    (void)tensorboard::hparams::HParamsPluginData::descriptor();
    (void)tensorflow::Event::descriptor();
    (void)tensorflow::SignatureDef::descriptor();
    (void)tensorflow::error::Code_descriptor();
    (void)tensorflow::serving::PredictRequest::descriptor();
    (void)tensorflow::serving::MultiInferenceRequest::descriptor();
    (void)tensorflow::serving::GetModelStatusRequest::descriptor();
    (void)tensorflow::serving::ReloadConfigRequest::descriptor();
    (void)tensorflow::serving::ModelServerConfig::descriptor();
    (void)tensorflow::serving::SSLConfig::descriptor();
    (void)tensorflow::serving::BatchingParameters::descriptor();
    return pb::DescriptorPool::generated_pool();
  }();
  return p;
}

// "kind name" of every allow-list entry of one section.
std::set<std::string> allowed(const std::string& section) {
  std::set<std::string> out;
  for (const auto& e : allow().at(section))
    out.insert(e.at("kind").get<std::string>() + " " + e.at("name").get<std::string>());
  return out;
}
bool is_allowed(const std::string& section, const std::string& kind, const std::string& name) {
  return allowed(section).count(kind + " " + name) > 0;
}

// A field's type written as upstream_fields.json writes it.
std::string type_of(const pb::FieldDescriptor* f) {
  auto base = [](const pb::FieldDescriptor* g) -> std::string {
    if (g->message_type()) return g->message_type()->full_name();
    if (g->enum_type()) return g->enum_type()->full_name();
    return g->type_name();
  };
  if (f->is_map()) {
    const pb::Descriptor* entry = f->message_type();
    return "map<" + base(entry->FindFieldByName("key")) + ", " + base(entry->FindFieldByName("value")) + ">";
  }
  return (f->is_repeated() ? "repeated " : "") + base(f);
}

const std::string kAllowFile = "proto/wire_compat_allow.json";

TEST(WireCompat, ListsAreLoaded) {
  EXPECT_GE(upstream().at("messages").size(), 100u);
  EXPECT_GE(upstream().at("enums").size(), 10u);
  EXPECT_EQ(upstream().at("services").size(), 3u);
}

TEST(WireCompat, EveryFileIsCompiledWithUpstreamsPackage) {
  for (const auto& [path, file] : upstream().at("files").items()) {
    const pb::FileDescriptor* d = pool()->FindFileByName(path);
    ASSERT_NE(d, nullptr) << path << " is listed in proto/upstream_fields.json but not compiled into kiln_proto";
    EXPECT_EQ(d->package(), file.at("package").get<std::string>()) << path;
  }
}

TEST(WireCompat, MessagesHaveUpstreamsFieldsNumbersAndTypes) {
  const WireJson& types = upstream().at("field_types");
  for (const auto& [name, fields] : upstream().at("messages").items()) {
    const pb::Descriptor* m = pool()->FindMessageTypeByName(name);
    ASSERT_NE(m, nullptr) << "message " << name << " is in proto/upstream_fields.json but kiln does not define it";
    for (const auto& [field, number] : fields.items()) {
      const pb::FieldDescriptor* f = m->FindFieldByName(field);
      if (!f) {
        EXPECT_TRUE(is_allowed("omitted", "field", name + "." + field))
            << name << "." << field << " = " << number
            << " is upstream but not in kiln's copy (add it, or list it under "
            << "'omitted' in " << kAllowFile << " with a reason)";
        continue;
      }
      EXPECT_EQ(f->number(), number.get<int>()) << name << "." << field << ": kiln's number differs from upstream's";
      if (types.contains(name) && types.at(name).contains(field))
        EXPECT_EQ(type_of(f), types.at(name).at(field).get<std::string>()) << name << "." << field;
    }
    for (int i = 0; i < m->field_count(); ++i) {
      const pb::FieldDescriptor* f = m->field(i);
      if (fields.contains(f->name())) continue;
      EXPECT_TRUE(is_allowed("kiln_only", "field", f->full_name()))
          << f->full_name() << " = " << f->number() << " is not upstream (list it under 'kiln_only' in " << kAllowFile
          << " with a reason, or remove it)";
    }
  }
}

TEST(WireCompat, EnumsHaveUpstreamsValues) {
  for (const auto& [name, values] : upstream().at("enums").items()) {
    const pb::EnumDescriptor* e = pool()->FindEnumTypeByName(name);
    ASSERT_NE(e, nullptr) << "enum " << name << " is in proto/upstream_fields.json but kiln does not define it";
    for (const auto& [value, number] : values.items()) {
      const pb::EnumValueDescriptor* v = e->FindValueByName(value);
      if (!v) {
        ADD_FAILURE() << name << "." << value << " = " << number << " is upstream but not in kiln's copy";
        continue;
      }
      EXPECT_EQ(v->number(), number.get<int>()) << name << "." << value;
    }
    for (int i = 0; i < e->value_count(); ++i)
      EXPECT_TRUE(values.contains(e->value(i)->name()) || is_allowed("kiln_only", "value", e->value(i)->full_name()))
          << e->value(i)->full_name() << " is not upstream";
  }
}

TEST(WireCompat, ServicesHaveUpstreamsRpcs) {
  for (const auto& [name, rpcs] : upstream().at("services").items()) {
    const pb::ServiceDescriptor* s = pool()->FindServiceByName(name);
    ASSERT_NE(s, nullptr) << "service " << name;
    for (const auto& [rpc, io] : rpcs.items()) {
      const pb::MethodDescriptor* m = s->FindMethodByName(rpc);
      if (!m) {
        ADD_FAILURE() << name << "." << rpc << " is upstream but not in kiln's copy";
        continue;
      }
      auto side = [](const pb::Descriptor* d, bool stream) { return (stream ? "stream " : "") + d->full_name(); };
      EXPECT_EQ(side(m->input_type(), m->client_streaming()), io.at(0).get<std::string>()) << name << "." << rpc;
      EXPECT_EQ(side(m->output_type(), m->server_streaming()), io.at(1).get<std::string>()) << name << "." << rpc;
    }
    for (int i = 0; i < s->method_count(); ++i)
      EXPECT_TRUE(rpcs.contains(s->method(i)->name()) || is_allowed("kiln_only", "rpc", s->method(i)->full_name()))
          << s->method(i)->full_name() << " is not upstream";
  }
}

// Every message, enum and service of each copied file is listed (or an
// allow-listed kiln extension): nothing kiln adds goes unnoticed.
TEST(WireCompat, NothingUnlistedInTheCopiedFiles) {
  const WireJson& up = upstream();
  std::function<void(const pb::Descriptor*)> walk_message = [&](const pb::Descriptor* m) {
    if (m->options().map_entry()) return;
    EXPECT_TRUE(up.at("messages").contains(m->full_name()) || is_allowed("kiln_only", "message", m->full_name()))
        << "message " << m->full_name() << " (" << m->file()->name() << ") is not upstream";
    for (int i = 0; i < m->nested_type_count(); ++i) walk_message(m->nested_type(i));
    for (int i = 0; i < m->enum_type_count(); ++i)
      EXPECT_TRUE(up.at("enums").contains(m->enum_type(i)->full_name()) ||
                  is_allowed("kiln_only", "enum", m->enum_type(i)->full_name()))
          << "enum " << m->enum_type(i)->full_name() << " is not upstream";
  };
  for (const auto& [path, file] : up.at("files").items()) {
    const pb::FileDescriptor* d = pool()->FindFileByName(path);
    ASSERT_NE(d, nullptr) << path;
    for (int i = 0; i < d->message_type_count(); ++i) walk_message(d->message_type(i));
    for (int i = 0; i < d->enum_type_count(); ++i)
      EXPECT_TRUE(up.at("enums").contains(d->enum_type(i)->full_name()) ||
                  is_allowed("kiln_only", "enum", d->enum_type(i)->full_name()))
          << "enum " << d->enum_type(i)->full_name() << " is not upstream";
    for (int i = 0; i < d->service_count(); ++i)
      EXPECT_TRUE(up.at("services").contains(d->service(i)->full_name())) << d->service(i)->full_name();
  }
}

// What upstream defines and kiln leaves out is a decision on record.
TEST(WireCompat, UpstreamOnlyItemsAreOmittedOnPurpose) {
  const WireJson& only = upstream().at("upstream_only");
  for (const char* kind : {"messages", "enums", "services"}) {
    std::string singular(kind, std::string(kind).size() - 1);
    for (const auto& [name, _] : only.at(kind).items())
      EXPECT_TRUE(is_allowed("omitted", singular, name))
          << singular << " " << name << " is upstream but not in kiln's copy (add it, or list it under 'omitted' in "
          << kAllowFile << " with a reason)";
  }
}

// Each allow-list entry has a reason, is still true, and a kiln-only field
// keeps clear of upstream's numbers (a later upstream client would read it as
// something else).
TEST(WireCompat, AllowListIsExactAndExplained) {
  const WireJson& up = upstream();
  for (const char* section : {"kiln_only", "omitted"}) {
    for (const auto& e : allow().at(section)) {
      const std::string kind = e.at("kind").get<std::string>(), name = e.at("name").get<std::string>();
      EXPECT_GE(e.value("reason", std::string()).size(), 20u) << section << " " << name << " needs a reason";
      bool in_kiln = false;
      if (kind == "message") in_kiln = pool()->FindMessageTypeByName(name) != nullptr;
      if (kind == "enum") in_kiln = pool()->FindEnumTypeByName(name) != nullptr;
      if (kind == "field") in_kiln = pool()->FindFieldByName(name) != nullptr;
      if (kind == "value") in_kiln = pool()->FindEnumValueByName(name) != nullptr;
      if (kind == "rpc") in_kiln = pool()->FindMethodByName(name) != nullptr;
      if (std::string(section) == "omitted") {
        EXPECT_FALSE(in_kiln) << "stale: " << kind << " " << name << " is omitted in " << kAllowFile
                              << " but kiln defines it now; remove the entry";
        continue;
      }
      EXPECT_TRUE(in_kiln) << "stale: kiln no longer defines " << kind << " " << name << "; remove it from "
                           << kAllowFile;
      if (kind != "field" || !in_kiln) continue;
      const pb::FieldDescriptor* f = pool()->FindFieldByName(name);
      const std::string message = f->containing_type()->full_name();
      EXPECT_EQ(f->number(), e.at("number").get<int>()) << name;
      if (up.at("messages").contains(message)) {
        EXPECT_FALSE(up.at("messages").at(message).contains(f->name())) << "stale: " << name << " is upstream now";
        for (const auto& [other, number] : up.at("messages").at(message).items())
          EXPECT_NE(number.get<int>(), f->number())
              << name << " takes upstream's number of " << message << "." << other;
      }
      if (up.at("reserved").contains(message))
        for (const auto& range : up.at("reserved").at(message).at("numbers"))
          EXPECT_FALSE(f->number() >= range.at(0).get<int>() && f->number() <= range.at(1).get<int>())
              << name << " takes a number upstream reserves";
    }
  }
}

}  // namespace kiln::serving::wire_compat_test
