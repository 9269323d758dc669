// kiln show MODEL_DIR
//
// What is inside a model directory, in the layout of TensorFlow's
// `saved_model_cli show --all`: the serving signature (inputs and outputs with
// name, dtype and shape; -1 for any size), then the layers table
// (Model::summary_string) with parameter counts, then how it was compiled
// and the files.
#include <sys/stat.h>

#include <iostream>
#include <memory>

#include "kiln/core/cpu_features.h"
#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/models/model.h"
#include "kiln/quantization/int8.h"
#include "kiln/saving/model_io.h"
#include "tools/kiln/cli.h"
#include "tools/kiln/gpu/gpus.h"

namespace kiln::cli {
namespace {

struct ShowOptions {
  std::string model_dir;
  bool system = false;
};

// The machine as kiln sees it: what decides which precision runs fast.
void print_system() {
  const CpuFeatures& cpu = cpu_features();
  std::cout << "CPU: " << cpu.model_name << "\n"
            << "Instruction sets: " << cpu.flags() << "\n"
            << "Class: " << cpu.isa_class() << " (oneDNN dispatches to "
            << (cpu.onednn_isa.empty() ? "- (not linked)" : cpu.onednn_isa) << ")\n"
            << "Threads: " << at::get_num_threads() << "\n"
            << "bfloat16: "
            << (cpu.fast_bf16() ? "native (mixed_bfloat16 is faster than float32)"
                                : "no native support (runs as float32; no speed-up)")
            << "\n"
            << "int8: " << (cpu.int8_dot() ? "VNNI/AMX dot products" : "no VNNI (smaller int8 speed-up)") << "; kernel "
            << quantization::int8_backend(1) << " at batch 1, " << quantization::int8_backend(256)
            << " at 256; fbgemm inputs " << (quantization::fbgemm_wide_inputs() ? "8 bits" : "7 bits where negative")
            << " (`kiln quantize` measures the speed-up)\n"
            << "float16, float8: emulated or upcast on CPU (for GPUs)\n";
  print_gpus(std::cout);
}

std::string dims(const Json& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += shape[i].is_null() ? "-1" : std::to_string(shape[i].get<int64_t>());
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

std::string describe(const Json& j) {  // "adam" or {"class_name": "Adam", "config": {...}}
  if (j.is_string()) return j.get<std::string>();
  if (j.is_array() || (j.is_object() && !j.contains("class_name"))) {
    // Per output: a list, or a dict by output name.
    std::string s;
    for (auto it = j.begin(); it != j.end(); ++it)
      s += (s.empty() ? "" : ", ") + (j.is_object() ? it.key() + ": " : std::string()) + describe(it.value());
    return "[" + s + "]";
  }
  if (j.is_object() && j.contains("class_name")) {
    std::string s = j["class_name"].get<std::string>();
    if (j.contains("config") && j["config"].is_object() && j["config"].contains("name") &&
        j["config"]["name"].is_string())
      s = j["config"]["name"].get<std::string>() + " = " + s;
    if (j.contains("config") && j["config"].is_object()) {
      std::string args;
      for (auto& [k, v] : j["config"].items()) {
        if (k == "name" || v.is_null() || (v.is_boolean() && !v.get<bool>())) continue;
        args += (args.empty() ? "" : ", ") + k + "=" + (v.is_string() ? v.get<std::string>() : v.dump());
      }
      if (!args.empty()) s += "(" + args + ")";
    }
    return s;
  }
  return j.dump();
}

void print_tensor_infos(const Json& infos, const char* kind) {
  std::cout << "  The given SignatureDef contains the following " << kind << "(s):\n";
  for (auto& [name, info] : infos.items()) {
    std::cout << "    " << kind << "s['" << name << "'] tensor_info:\n";
    std::cout << "        dtype: " << info.value("dtype", "float32") << "\n";
    std::cout << "        shape: " << dims(info.value("shape", Json::array())) << "\n";
  }
}

void print_files(const std::string& model_dir) {
  std::cout << "\nFiles:\n";
  for (auto& name : list_directory(model_dir)) {
    struct stat st {};
    const std::string p = join_path(model_dir, name);
    if (::stat(p.c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode))
      std::cout << "  " << name << "/\n";
    else
      std::cout << "  " << name << "  " << st.st_size << " bytes\n";
  }
}

void run_show(const ShowOptions& o) {
  if (o.system) {
    print_system();
    if (o.model_dir.empty()) return;
    std::cout << "\n";
  }
  if (o.model_dir.empty()) throw ValueError("give a model directory (e.g. models/fashion_mnist/1), or --system");
  Json mj = read_model_json(o.model_dir);
  ModelPtr model = load_model(o.model_dir);

  std::cout << "Model directory " << o.model_dir << " (" << mj.value("format", "") << " format "
            << mj.value("format_version", 0) << ", dtype policy " << mj.value("dtype_policy", "float32") << ")\n";
  const std::string q = model->quantization_summary();
  std::cout << "Quantization: " << (q.empty() ? "none" : q) << "\n\n";

  Json sigs = mj.value("signatures", Json::object());
  if (sigs.empty()) sigs = model_signatures(*model);
  std::cout << "The model contains the following SignatureDefs:\n";
  for (auto& [key, sig] : sigs.items()) {
    std::cout << "\nsignature_def['" << key << "']:\n";
    print_tensor_infos(sig.value("inputs", Json::object()), "input");
    print_tensor_infos(sig.value("outputs", Json::object()), "output");
    std::cout << "  Method name is: " << sig.value("method_name", "predict") << "\n";
  }

  if (mj.value("class_name", "") == "Ensemble") {
    // An ensemble has no layers of its own: list its members instead.
    const Json members = mj["config"].value("members", Json::array());
    std::cout << "\nEnsemble of " << members.size() << " members (kiln show " << o.model_dir
              << "/members/<i> shows each):\n";
    for (auto& m : members)
      std::cout << "  " << m.value("path", "") << "  " << m.value("kind", "") << "  weight "
                << format_metric(m.value("weight", 0.0)) << "  " << m.value("name", "") << "\n";
  }
  if (mj.value("class_name", "") == "Ensemble") {
    // Its members' layers are theirs: `kiln show <dir>/members/<i>`.
    print_files(o.model_dir);
    return;
  }
  std::cout << "\n" << model->summary_string();
  int64_t total = model->count_params(), trainable = 0;
  for (auto& v : model->trainable_weights()) trainable += v->value().numel();
  std::cout << "Parameters: total=" << total << " trainable=" << trainable << " non_trainable=" << (total - trainable)
            << "\n";

  const Json& cc = mj.contains("compile_config") ? mj["compile_config"] : Json(nullptr);
  if (cc.is_object()) {
    std::cout << "\nCompiled with:\n  optimizer: " << describe(cc.value("optimizer", Json(nullptr)))
              << "\n  loss: " << describe(cc.value("loss", Json(nullptr)))
              << (cc.contains("loss_weights") && !cc["loss_weights"].is_null()
                      ? "\n  loss_weights: " + cc["loss_weights"].dump()
                      : std::string())
              << "\n  metrics: ";
    std::string ms;
    const Json metrics = cc.value("metrics", Json::array());
    if (metrics.is_object())
      ms = describe(metrics);  // by output name
    else
      for (auto& m : metrics) ms += (ms.empty() ? "" : ", ") + describe(m);
    std::cout << (ms.empty() ? "-" : ms) << "\n";
  } else {
    std::cout << "\nNot compiled (no loss or optimizer saved).\n";
  }

  print_files(o.model_dir);
}

}  // namespace

Command add_show_command(CLI::App& app) {
  auto o = std::make_shared<ShowOptions>();
  CLI::App* sub = app.add_subcommand("show", "Show a saved model's signatures, layers and parameter counts");
  sub->add_option("model_dir", o->model_dir, "A model version directory, e.g. models/fashion_mnist/1");
  sub->add_flag("--system", o->system,
                "Show the CPU's instruction sets, the GPUs, and which precisions run fast on them");
  return {sub, [o] { run_show(*o); }};
}

}  // namespace kiln::cli
