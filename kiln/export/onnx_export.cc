#include "kiln/export/onnx_export.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/core/string_tensor.h"
#include "kiln/export/onnx_graph.h"

namespace kiln::exporter {
namespace onnx {

const std::map<std::string, Exporter>& exporters() {
  static const std::map<std::string, Exporter> table = {
      {"Activation", export_activation},
      {"Add", export_merge},
      {"Average", export_merge},
      {"AveragePooling1D", export_pooling},
      {"AveragePooling2D", export_pooling},
      {"BatchNormalization", export_batch_normalization},
      {"Bidirectional", export_bidirectional},
      {"CategoryEncoding", export_category_encoding},
      {"Concatenate", export_concatenate},
      {"Conv1D", export_conv},
      {"Conv2D", export_conv},
      {"Conv2DTranspose", export_conv_transpose},
      {"Cropping2D", export_cropping_2d},
      {"Dense", export_dense},
      {"DepthwiseConv2D", export_depthwise_conv},
      {"Dropout", export_identity},
      {"EinsumDense", export_einsum_dense},
      {"Embedding", export_embedding},
      {"Flatten", export_flatten},
      {"Functional", export_model},
      {"GaussianNoise", export_identity},
      {"GlobalAveragePooling1D", export_global_pooling},
      {"GlobalAveragePooling2D", export_global_pooling},
      {"GlobalMaxPooling1D", export_global_pooling},
      {"GlobalMaxPooling2D", export_global_pooling},
      {"GroupNormalization", export_group_normalization},
      {"GRU", export_recurrent},
      {"InputLayer", export_identity},
      {"IntegerLookup", export_integer_lookup},
      {"LayerNormalization", export_layer_normalization},
      {"LeakyReLU", export_leaky_relu},
      {"LSTM", export_recurrent},
      {"Masking", export_masking},
      {"Maximum", export_merge},
      {"MaxPooling1D", export_pooling},
      {"MaxPooling2D", export_pooling},
      {"Minimum", export_merge},
      {"MultiHeadAttention", export_multi_head_attention},
      {"Multiply", export_merge},
      {"Normalization", export_normalization},
      {"Permute", export_permute},
      {"PReLU", export_prelu},
      {"RandomFlip", export_identity},  // the Random* augmentations are the identity at inference
      {"RandomRotation", export_identity},
      {"RandomTranslation", export_identity},
      {"RandomZoom", export_identity},
      {"ReLU", export_relu},
      {"RepeatVector", export_repeat_vector},
      {"Rescaling", export_rescaling},
      {"Resizing", export_resizing},
      {"Reshape", export_reshape},
      {"SeparableConv2D", export_depthwise_conv},
      {"Sequential", export_model},
      {"SimpleRNN", export_recurrent},
      {"Softmax", export_softmax},
      {"SpatialDropout2D", export_identity},
      {"StringLookup", export_string_lookup},
      {"Subtract", export_merge},
      {"TextVectorization", export_text_vectorization},
      {"TimeDistributed", export_time_distributed},
      {"UpSampling2D", export_up_sampling_2d},
      {"ZeroPadding2D", export_zero_padding_2d},
  };
  return table;
}

// Registered layer classes without an ONNX export, and why (with the alternative).
const std::map<std::string, std::string>& without_onnx_form() {
  static const std::map<std::string, std::string> table = {
      {"Hashing",
       "it hashes the decimal string of each id (or each string) with FarmHash Fingerprint64 or SipHash-2-4, which no "
       "ONNX operator computes; hash the ids before the model (kiln::hash_strings in the data pipeline), or the "
       "strings, and export the rest"},
  };
  return table;
}

// Exported classes with settings that have no ONNX form: their exporters
// refuse those, naming the setting.
const std::map<std::string, std::string>& partly_without_onnx_form() {
  static const std::map<std::string, std::string> table = {
      {"StringLookup",
       "num_oov_indices other than 1 (kiln hashes unknown tokens over several OOV ids with FarmHash Fingerprint64, "
       "which no ONNX operator computes), invert=true and the encoding output modes (encode the ids with "
       "CategoryEncoding)"},
      {"TextVectorization",
       "standardize with strip_punctuation (ONNX has no regular-expression replace: export with standardize=\"lower\" "
       "and strip punctuation before the model), split=\"character\" (no ONNX operator splits a string into "
       "characters) and ngrams"},
  };
  return table;
}

std::string no_export_reason(const std::string& cls) {
  auto it = without_onnx_form().find(cls);
  if (it != without_onnx_form().end()) return "has no ONNX export: " + it->second;
  return "has no ONNX export (no exporter is registered for this class in kiln/export/onnx_export.cc)";
}

}  // namespace onnx

namespace {
using onnx::exporters;

constexpr int64_t kStringOpset = 20;
using onnx::GraphBuilder;
using onnx::LayerEmitter;
using onnx::partly_without_onnx_form;
using onnx::without_onnx_form;

// Stores the float32 initializers as float16, each read through a Cast to
// float32 under its old name, so the ops (and their float32 compute) are
// unchanged. The Casts go first: the nodes stay topologically sorted.
// An initializer with a finite value beyond float16's range stays float32.
void store_weights_as_float16(GraphBuilder& b) {
  auto* g = b.graph();
  google::protobuf::RepeatedPtrField<kiln_onnx::NodeProto> nodes;
  for (auto& init : *g->mutable_initializer()) {
    if (init.data_type() != kiln_onnx::TensorProto::FLOAT) continue;
    at::Tensor t = at::empty(std::vector<int64_t>(init.dims().begin(), init.dims().end()), at::kFloat);
    std::memcpy(t.data_ptr(), init.raw_data().data(), t.numel() * sizeof(float));
    at::Tensor h = t.to(at::kHalf);
    if (h.isinf().logical_and(t.isfinite()).any().item<bool>()) continue;
    const std::string name = init.name();
    init.set_name(b.fresh(name + "_f16"));
    init.set_data_type(kiln_onnx::TensorProto::FLOAT16);
    init.set_raw_data(std::string(static_cast<const char*>(h.data_ptr()), h.numel() * h.element_size()));
    auto* cast = nodes.Add();
    cast->set_op_type("Cast");
    cast->set_name(name);
    cast->add_input(init.name());
    cast->add_output(name);
    GraphBuilder::attr(cast, "to", (int64_t)kiln_onnx::TensorProto::FLOAT);
  }
  nodes.MergeFrom(g->node());
  g->mutable_node()->Swap(&nodes);
}

// OnnxExportOptions::optimize: removes the nodes that only pass values on,
// which leaves every output bit for bit as it was:
//   * Identity (Dropout, noise and augmentation layers, nested models'
//     outputs): its consumers read its input; one that names a graph output
//     renames its input's producer instead, when nothing else reads it;
//   * a Reshape or Flatten that keeps the batch axis (Flatten axis 1, a
//     Reshape to [0, ...] with no other 0) and feeds only another such node:
//     the second one gives the same result from the first one's input.
// Initializers nothing reads any more (the dropped Reshapes' shapes) go too.
void drop_pass_through_nodes(kiln_onnx::GraphProto* g) {
  std::set<std::string> outputs, sources;  // graph outputs; graph inputs and initializers
  for (auto& o : g->output()) outputs.insert(o.name());
  for (auto& i : g->input()) sources.insert(i.name());
  std::map<std::string, const kiln_onnx::TensorProto*> inits;
  for (auto& t : g->initializer()) {
    sources.insert(t.name());
    inits[t.name()] = &t;
  }
  auto keeps_batch = [&](const kiln_onnx::NodeProto& n) {
    if (n.op_type() == "Flatten") {
      for (auto& a : n.attribute())
        if (a.name() == "axis") return a.i() == 1;
      return true;  // axis defaults to 1
    }
    if (n.op_type() != "Reshape" || n.input_size() != 2 || !inits.count(n.input(1))) return false;
    for (auto& a : n.attribute())
      if (a.name() == "allowzero" && a.i() != 0) return false;
    const auto* shape = inits.at(n.input(1));
    if (shape->data_type() != kiln_onnx::TensorProto::INT64) return false;
    std::vector<int64_t> v(shape->raw_data().size() / sizeof(int64_t));
    std::memcpy(v.data(), shape->raw_data().data(), v.size() * sizeof(int64_t));
    return !v.empty() && v[0] == 0 && std::count(v.begin(), v.end(), 0) == 1;
  };
  auto* nodes = g->mutable_node();
  std::vector<bool> dropped(nodes->size(), false);
  auto uses = [&](const std::string& value) {
    int n = 0;
    for (int i = 0; i < nodes->size(); ++i)
      if (!dropped[i])
        for (auto& in : nodes->Get(i).input()) n += in == value;
    return n;
  };
  std::map<std::string, int> producer;  // value -> index of the node that makes it
  std::map<std::string, std::string> alias;
  for (int i = 0; i < nodes->size(); ++i) {
    auto* n = nodes->Mutable(i);
    for (auto& in : *n->mutable_input())
      if (alias.count(in)) in = alias.at(in);
    if (n->op_type() == "Identity" && !outputs.count(n->output(0))) {
      alias[n->output(0)] = n->input(0);
      dropped[i] = true;
      continue;
    }
    if (keeps_batch(*n) && producer.count(n->input(0))) {
      const int p = producer.at(n->input(0));
      if (keeps_batch(nodes->Get(p)) && !outputs.count(n->input(0)) && uses(n->input(0)) == 1) {
        n->set_input(0, nodes->Get(p).input(0));
        dropped[p] = true;
      }
    }
    for (auto& out : n->output()) producer[out] = i;
  }
  // Identities that name graph outputs.
  for (int i = 0; i < nodes->size(); ++i) {
    auto* n = nodes->Mutable(i);
    if (dropped[i] || n->op_type() != "Identity") continue;
    const std::string in = n->input(0);
    if (sources.count(in) || outputs.count(in) || !producer.count(in) || uses(in) != 1) continue;
    auto* p = nodes->Mutable(producer.at(in));
    for (auto& out : *p->mutable_output())
      if (out == in) out = n->output(0);
    dropped[i] = true;
  }
  google::protobuf::RepeatedPtrField<kiln_onnx::NodeProto> kept;
  for (int i = 0; i < nodes->size(); ++i)
    if (!dropped[i]) kept.Add()->Swap(nodes->Mutable(i));
  nodes->Swap(&kept);
  std::set<std::string> read;
  for (auto& n : g->node())
    for (auto& in : n.input()) read.insert(in);
  auto* initializers = g->mutable_initializer();
  for (int i = initializers->size() - 1; i >= 0; --i)
    if (!read.count(initializers->Get(i).name())) initializers->DeleteSubrange(i, 1);
}

}  // namespace

void OnnxExportOptions::validate() const {
  if (weights != "float32" && weights != "float16")
    throw ValueError(
        "export_onnx: received an invalid value for `weights`, expected \"float32\" or \"float16\". Received: "
        "weights=" +
        weights);
  if (opset < 13 || opset > 17)
    throw ValueError(
        "export_onnx: received an invalid value for `opset`, expected 13 to 17 (ReduceMean takes `axes` "
        "as an attribute up to 17). Received: opset=" +
        std::to_string(opset));
}

int64_t onnx_opset(const models::Model& model, const OnnxExportOptions& options) {
  // String inputs feed StringSplit, which came at opset 20.
  const auto types = model.input_dtypes();
  const bool strings = std::any_of(types.begin(), types.end(), is_string_dtype);
  return strings ? std::max<int64_t>(options.opset, kStringOpset) : options.opset;
}

std::string export_onnx_bytes(models::Model& model, const OnnxExportOptions& options) {
  options.validate();
  if (!model.built()) throw StateError("export_onnx: the model is not built; call it on data or give it an Input");
  const auto in_types = model.input_dtypes();
  const int64_t opset_version = onnx_opset(model, options);
  kiln_onnx::ModelProto proto;
  proto.set_ir_version(opset_version >= kStringOpset ? 9 : 8);  // opset 20 came with IR version 9
  proto.set_producer_name("kiln");
  proto.set_producer_version("1");
  auto* opset = proto.add_opset_import();
  opset->set_domain("");
  opset->set_version(opset_version);
  GraphBuilder b(proto.mutable_graph(), opset_version);
  b.graph()->set_name(options.graph_name.empty() ? model.name() : options.graph_name);
  LayerEmitter e(b, options.qat_as_int8);

  const auto in_names = model.input_names();
  const auto in_shapes = model.input_shapes();
  for (size_t i = 0; i < in_names.size(); ++i) {
    b.fresh(in_names[i]);
    e.set_type(in_names[i], i < in_types.size() ? in_types[i] : at::kFloat);
    b.value_info(b.graph()->mutable_input(), in_names[i], i < in_types.size() ? in_types[i] : at::kFloat,
                 in_shapes.at(i));
  }

  // Graph outputs keep kiln's output names; reserve them before any op is named.
  std::vector<std::string> out_names = model.output_names();
  const auto out_shapes = model.output_shapes();
  for (size_t i = 0; i < out_shapes.size(); ++i) {
    if (i >= out_names.size()) out_names.push_back("output_" + std::to_string(i));
    out_names[i] = b.fresh(out_names[i]);
  }

  std::vector<std::string> outputs = e.emit_model(model, in_names);

  for (size_t i = 0; i < outputs.size(); ++i) {
    b.node("Identity", {outputs[i]}, out_names[i]);
    // Float outputs are float32 (16-bit policies included); integer ones (IntegerLookup) keep their type.
    const at::ScalarType t = e.type_of(outputs[i]);
    b.value_info(b.graph()->mutable_output(), out_names[i], at::isFloatingType(t) ? at::kFloat : t, out_shapes.at(i));
  }
  for (auto& [domain, version] : b.domains()) {
    auto* o = proto.add_opset_import();
    o->set_domain(domain);
    o->set_version(version);
  }
  if (options.optimize) drop_pass_through_nodes(b.graph());
  if (options.weights == "float16") store_weights_as_float16(b);
  return proto.SerializeAsString();
}

std::vector<OnnxLayerSupport> onnx_layer_support() {
  std::vector<OnnxLayerSupport> out;
  for (const auto& cls : LayerRegistry::names()) {
    OnnxLayerSupport s{cls, exporters().count(cls) > 0, ""};
    auto it = without_onnx_form().find(cls);
    if (it != without_onnx_form().end()) s.reason = it->second;
    auto partly = partly_without_onnx_form().find(cls);
    if (s.exported && partly != partly_without_onnx_form().end()) s.except = partly->second;
    out.push_back(s);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.class_name < b.class_name; });
  return out;
}

std::string onnx_conformance_table() {
  std::string t = "| layer class | ONNX export |\n|---|---|\n";
  for (const auto& s : onnx_layer_support()) {
    if (s.class_name.rfind("TestOnly", 0) == 0) continue;
    const std::string exported = s.except.empty() ? "exported" : "exported, except " + s.except;
    t += "| " + s.class_name + " | " + (s.exported ? exported : "no: " + s.reason) + " |\n";
  }
  return t;
}

void export_onnx(models::Model& model, const std::string& path, const OnnxExportOptions& options) {
  atomic_write_file(path, export_onnx_bytes(model, options));
}

}  // namespace kiln::exporter
