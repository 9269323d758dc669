#include "kiln/tuning/hparams_summary.h"

#include <variant>

#include "kiln/training/tfevents.h"
#include "tensorboard/plugins/hparams/plugin_data.pb.h"
#include "tensorflow/core/util/event.pb.h"

namespace kiln::tuning {
namespace {

namespace hp = tensorboard::hparams;

google::protobuf::Value to_proto_value(const Value& v) {
  google::protobuf::Value out;
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, bool>) {
          out.set_bool_value(x);
        } else if constexpr (std::is_same_v<T, std::string>) {
          out.set_string_value(x);
        } else {
          out.set_number_value(static_cast<double>(x));
        }
      },
      v);
  return out;
}

hp::DataType data_type_of(const Value& v) {
  if (std::holds_alternative<bool>(v)) return hp::DATA_TYPE_BOOL;
  if (std::holds_alternative<std::string>(v)) return hp::DATA_TYPE_STRING;
  return hp::DATA_TYPE_FLOAT64;
}

// One event holding one "hparams" plugin summary with `data` as content.
void write_plugin_event(EventFileWriter& w, const std::string& tag, const hp::HParamsPluginData& data,
                        double wall_time) {
  tensorflow::Event ev;
  ev.set_wall_time(wall_time);
  auto* value = ev.mutable_summary()->add_value();
  value->set_tag(tag);
  auto* plugin = value->mutable_metadata()->mutable_plugin_data();
  plugin->set_plugin_name("hparams");
  plugin->set_content(data.SerializeAsString());
  // TensorBoard's own hparams summaries carry a scalar 0.0 float tensor.
  auto* t = value->mutable_tensor();
  t->set_dtype(tensorflow::DT_FLOAT);
  t->mutable_tensor_shape();
  t->add_float_val(0.0f);
  w.add_event(ev.SerializeAsString());
  w.flush();
}

}  // namespace

void write_hparams_experiment(EventFileWriter& w, const HyperParameters& space, const std::vector<std::string>& metrics,
                              double wall_time) {
  hp::HParamsPluginData data;
  auto* ex = data.mutable_experiment();
  ex->set_time_created_secs(wall_time);
  for (const HyperParameter& h : space.space()) {
    auto* info = ex->add_hparam_infos();
    info->set_name(h.name);
    switch (h.kind) {
      case HpKind::kInt:
      case HpKind::kFloat:
        info->set_type(hp::DATA_TYPE_FLOAT64);
        info->mutable_domain_interval()->set_min_value(h.min_value);
        info->mutable_domain_interval()->set_max_value(h.max_value);
        break;
      case HpKind::kBoolean:
        info->set_type(hp::DATA_TYPE_BOOL);
        for (bool b : {false, true}) info->mutable_domain_discrete()->add_values()->set_bool_value(b);
        break;
      case HpKind::kChoice:
      case HpKind::kFixed: {
        std::vector<Value> values = h.grid();
        if (values.empty()) break;
        info->set_type(data_type_of(values.front()));
        for (auto& v : values) *info->mutable_domain_discrete()->add_values() = to_proto_value(v);
        break;
      }
    }
  }
  for (const std::string& m : metrics) {
    auto* info = ex->add_metric_infos();
    info->mutable_name()->set_tag(m);
    bool val = m.rfind("val_", 0) == 0;
    info->set_dataset_type(val ? hp::DATASET_VALIDATION : hp::DATASET_UNKNOWN);
  }
  write_plugin_event(w, "_hparams_/experiment", data, wall_time);
}

void write_hparams_session_start(EventFileWriter& w, const HyperParameters& values, const std::string& trial_id,
                                 double wall_time) {
  hp::HParamsPluginData data;
  auto* start = data.mutable_session_start_info();
  for (auto& [name, v] : values.values()) (*start->mutable_hparams())[name] = to_proto_value(v);
  start->set_group_name(trial_id);
  start->set_start_time_secs(wall_time);
  write_plugin_event(w, "_hparams_/session_start_info", data, wall_time);
}

void write_hparams_session_end(EventFileWriter& w, TrialStatus status, double wall_time) {
  hp::HParamsPluginData data;
  auto* end = data.mutable_session_end_info();
  end->set_status(status == TrialStatus::kCompleted ? hp::STATUS_SUCCESS
                  : status == TrialStatus::kFailed  ? hp::STATUS_FAILURE
                                                    : hp::STATUS_UNKNOWN);
  end->set_end_time_secs(wall_time);
  write_plugin_event(w, "_hparams_/session_end_info", data, wall_time);
}

}  // namespace kiln::tuning
