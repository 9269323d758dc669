// kiln predict MODEL_DIR [--input FILE.jsonl|-] [--output FILE|-] [--batch_size N]
// kiln predict --grpc HOST:PORT --model_name M [--model_version V | --version_label L]
//              [--signature_name S] [--ssl_ca CA.pem] [--ssl_client_cert C.pem --ssl_client_key K.pem]
//              [--bearer_token_file F] [--input ...] [--output ...]
//
// The second form asks a model server (kiln serve, TF Serving) over
// tensorflow.serving.PredictionService: the signature comes from
// GetModelMetadata, each batch is one Predict call; input and output are the
// same as for a local model (the instance format: kiln/batch/instances.h).
//
// JSON Lines in, JSON Lines out, in order. Each input line is one instance:
//   [0.1, 0.2, ...]                       a nested list (one-input models)
//   {"inputs": [0.1, ...]}                the same, TF Serving-style
//   {"inputs": {"a": [...], "b": [...]}}  named inputs
//   {"a": [...], "b": [...]}              named inputs, per the signature
//   "some text"                           a string input (dtype "string")
//   {"text": "some text"}                 the same, named
// Each output line is {"predictions": [...]} (one-output models) or
// {"predictions": {"<output name>": [...], ...}} (string outputs as JSON
// strings). Blank lines are skipped.
// Float32 values are written in their shortest form that reads back to the
// same float; NaN and infinities (not JSON) are written as null.
//
// Instances are checked against the model's signature (names, rank, dims)
// before anything runs, so a wrong width is a one-line error naming the line.
// Lines are batched (--batch_size) and each batch is written and flushed as
// soon as it is predicted, so the command works in a pipe.
#include <cctype>
#include <charconv>
#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>
#include <set>
#include <sstream>

#include "kiln/batch/instances.h"
#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/core/string_tensor.h"
#include "kiln/core/tensor_json.h"
#include "kiln/models/model.h"
#include "kiln/saving/model_io.h"
#include "kiln/serving/grpc/grpc_client.h"
#include "kiln/serving/status.h"
#include "kiln/serving/tls.h"
#include "tools/kiln/cli.h"

namespace kiln::cli {
namespace {

struct PredictOptions {
  std::string model_dir;
  std::string input = "-";
  std::string output = "-";
  int64_t batch_size = 32;
  // --grpc: ask a server (TF Serving's PredictionService) instead.
  std::string grpc;
  std::string model_name;
  int64_t model_version = 0;  // 0: the latest
  std::string version_label;
  std::string signature_name = "serving_default";
  std::string ssl_ca;
  std::string ssl_client_cert, ssl_client_key;  // mutual TLS (kiln serve --ssl_client_ca)
  std::string bearer_token_file;
  double timeout_seconds = 60;
};

// Where predictions come from: a model loaded here, or a server over gRPC.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual const std::vector<batch::InstanceInput>& inputs() const = 0;
  // Named outputs of one batch, each with the batch along dim 0.
  virtual std::vector<std::pair<std::string, at::Tensor>> run(const Tensors& x) = 0;
  // The outputs of dtype string (string tensors, written as JSON strings).
  const std::set<std::string>& string_outputs() const { return string_outputs_; }

 protected:
  std::set<std::string> string_outputs_;
};

class LocalBackend : public Backend {
 public:
  LocalBackend(const std::string& dir, int64_t batch_size)
      : model_(load_model(dir)), inputs_(batch::instance_inputs(*model_)), batch_size_(batch_size) {
    // Keep the signatures alive: a range-for over a sub-object of the
    // temporary model_signatures() returns reads freed memory.
    const Json signatures = model_signatures(*model_);
    for (auto& [name, info] : signatures.at("serving_default").at("outputs").items()) {
      output_names_.push_back(name);
      if (info.value("dtype", "") == dtype_to_string(kStringDType)) string_outputs_.insert(name);
    }
  }
  const std::vector<batch::InstanceInput>& inputs() const override { return inputs_; }
  std::vector<std::pair<std::string, at::Tensor>> run(const Tensors& x) override {
    Tensors y = model_->predict(x, {.batch_size = batch_size_});
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (size_t k = 0; k < y.size(); ++k)
      out.emplace_back(k < output_names_.size() ? output_names_[k] : "output_" + std::to_string(k), y[k]);
    return out;
  }

 private:
  ModelPtr model_;
  std::vector<batch::InstanceInput> inputs_;
  int64_t batch_size_;
  std::vector<std::string> output_names_;
};

// tensorflow.serving.PredictionService: the signature from GetModelMetadata,
// each batch one Predict call.
class GrpcBackend : public Backend {
 public:
  explicit GrpcBackend(serving::PredictionClientOptions o) : client_(std::move(o)) {
    const serving::ClientSignature sig = client_.signature();
    for (auto& t : sig.inputs) {
      if (t.shape.empty())
        throw ValueError("the server's input '" + t.name + "' has no batch dimension; kiln predict sends batches");
      inputs_.push_back({t.name, t.dtype, Shape(t.shape.begin() + 1, t.shape.end())});
    }
    for (auto& t : sig.outputs)
      if (is_string_dtype(t.dtype)) string_outputs_.insert(t.name);
  }
  const std::vector<batch::InstanceInput>& inputs() const override { return inputs_; }
  std::vector<std::pair<std::string, at::Tensor>> run(const Tensors& x) override {
    serving::TensorMap in;
    for (size_t i = 0; i < inputs_.size(); ++i) in[inputs_[i].name] = x[i];
    serving::TensorMap y = client_.predict(in);
    return {y.begin(), y.end()};  // name order
  }

 private:
  serving::PredictionClient client_;
  std::vector<batch::InstanceInput> inputs_;
};

class Predictor {
 public:
  Predictor(Backend& backend, std::ostream& out, int64_t batch_size)
      : backend_(backend), out_(out), batch_size_(batch_size) {}

  const std::vector<batch::InstanceInput>& inputs() const { return backend_.inputs(); }

  void add(batch::Instance instance, int64_t line_no) {
    // Instances of different shapes (inputs with None dims) cannot share a batch.
    if (!pending_.empty() && !batch::same_shapes(instance, pending_[0])) flush();
    if (pending_.empty()) first_line_ = line_no;
    last_line_ = line_no;
    pending_.push_back(std::move(instance));
    if ((int64_t)pending_.size() >= batch_size_) flush();
  }

  void flush() {
    if (pending_.empty()) return;
    const int64_t n = (int64_t)pending_.size();
    std::vector<const batch::Instance*> rows;
    for (auto& p : pending_) rows.push_back(&p);
    std::vector<std::pair<std::string, at::Tensor>> y;
    try {
      y = backend_.run(batch::stack_instances(rows, inputs()));
    } catch (const serving::ServingError& e) {
      // The server's answer, with the lines it was about; user-side codes exit 2.
      const std::string m = "lines " + std::to_string(first_line_) + "-" + std::to_string(last_line_) + ": " + e.what();
      switch (e.code()) {
        case serving::Code::kNotFound:
          throw NotFoundError(m);
        case serving::Code::kInvalidArgument:
        case serving::Code::kFailedPrecondition:
        case serving::Code::kOutOfRange:
        case serving::Code::kUnauthenticated:
        case serving::Code::kPermissionDenied:
        case serving::Code::kUnavailable:
        case serving::Code::kDeadlineExceeded:
        case serving::Code::kResourceExhausted:
          throw ValueError(m);
        default:
          throw;
      }
    }
    std::string buf;
    auto append = [&](const std::string& name, const at::Tensor& row) {
      if (backend_.string_outputs().count(name))
        buf += string_tensor_to_json(row).dump(-1, ' ', false, Json::error_handler_t::replace);
      else
        append_tensor_json(buf, row);
    };
    for (int64_t r = 0; r < n; ++r) {
      buf += "{\"predictions\":";
      if (y.size() == 1) {
        append(y[0].first, y[0].second[r]);
      } else {
        buf += '{';
        for (size_t k = 0; k < y.size(); ++k) {
          if (k) buf += ',';
          buf += Json(y[k].first).dump() + ":";
          append(y[k].first, y[k].second[r]);
        }
        buf += '}';
      }
      buf += "}\n";
    }
    out_ << buf;
    out_.flush();
    pending_.clear();
  }

 private:
  Backend& backend_;
  std::ostream& out_;
  int64_t batch_size_;
  std::vector<batch::Instance> pending_;
  int64_t first_line_ = 0, last_line_ = 0;
};

// ServingError from the client (unreachable server, unknown model) before
// any line is read: user-side codes exit 2.
std::unique_ptr<Backend> connect(const PredictOptions& o) {
  serving::PredictionClientOptions c;
  c.target = o.grpc;
  c.model_name = o.model_name;
  if (o.model_version > 0) c.version = o.model_version;
  c.version_label = o.version_label;
  c.signature_name = o.signature_name;
  if (!o.ssl_ca.empty()) {
    c.ca_pem = read_option_file(o.ssl_ca, "--ssl_ca");
    c.tls = true;
  }
  if (o.ssl_client_cert.empty() != o.ssl_client_key.empty())
    throw ValueError("--ssl_client_cert and --ssl_client_key go together (the certificate and its private key)");
  if (!o.ssl_client_cert.empty()) {
    serving::TlsOptions mine;  // checked like a server's: both parse, and the key is the certificate's
    mine.cert_pem = read_option_file(o.ssl_client_cert, "--ssl_client_cert");
    mine.key_pem = read_option_file(o.ssl_client_key, "--ssl_client_key");
    serving::check_tls_options(mine, "--ssl_client_cert/--ssl_client_key");
    c.client_cert_pem = mine.cert_pem;
    c.client_key_pem = mine.key_pem;
    c.tls = true;
  }
  if (!o.bearer_token_file.empty()) {
    std::ifstream f(o.bearer_token_file);
    if (!f) throw NotFoundError("--bearer_token_file: file not found: " + o.bearer_token_file);
    std::getline(f, c.bearer_token);
    while (!c.bearer_token.empty() && std::isspace((unsigned char)c.bearer_token.back())) c.bearer_token.pop_back();
    if (c.bearer_token.empty()) throw ValueError("--bearer_token_file " + o.bearer_token_file + " is empty");
  }
  c.timeout_seconds = o.timeout_seconds;
  try {
    return std::make_unique<GrpcBackend>(std::move(c));
  } catch (const serving::ServingError& e) {
    if (e.code() == serving::Code::kNotFound) throw NotFoundError(e.what());
    if (e.code() == serving::Code::kInternal || e.code() == serving::Code::kUnknown) throw;
    throw ValueError(e.what());
  }
}

void run_predict(const PredictOptions& o) {
  const bool remote = !o.grpc.empty();
  if (remote && !o.model_dir.empty())
    throw ValueError("give either MODEL_DIR (predict here) or --grpc HOST:PORT (ask a server), not both");
  if (!remote && o.model_dir.empty())
    throw ValueError("kiln predict needs a MODEL_DIR, or --grpc HOST:PORT --model_name NAME to query a server");
  const std::pair<const char*, bool> remote_only[] = {{"--model_name", !o.model_name.empty()},
                                                      {"--model_version", o.model_version != 0},
                                                      {"--version_label", !o.version_label.empty()},
                                                      {"--ssl_ca", !o.ssl_ca.empty()},
                                                      {"--ssl_client_cert", !o.ssl_client_cert.empty()},
                                                      {"--ssl_client_key", !o.ssl_client_key.empty()},
                                                      {"--bearer_token_file", !o.bearer_token_file.empty()},
                                                      {"--signature_name", o.signature_name != "serving_default"}};
  if (!remote)
    for (auto& [flag, set] : remote_only)
      if (set) throw ValueError(std::string(flag) + " applies to --grpc HOST:PORT only; a MODEL_DIR is run here");
  if (remote && o.model_name.empty())
    throw ValueError("--grpc needs --model_name (the name the server serves the model under)");
  if (o.model_version < 0)
    throw ValueError("--model_version must be a positive integer. Received: " + std::to_string(o.model_version));

  std::ifstream in_file;
  std::istream* in = &std::cin;
  if (o.input != "-") {
    in_file.open(o.input);
    if (!in_file) throw NotFoundError("cannot read --input " + o.input + ": no such file");
    in = &in_file;
  }
  std::unique_ptr<Backend> backend =
      remote ? connect(o) : std::unique_ptr<Backend>(new LocalBackend(o.model_dir, o.batch_size));
  std::ofstream out_file;
  std::ostream* out = &std::cout;
  if (o.output != "-") {
    out_file.open(o.output, std::ios::out | std::ios::trunc);
    if (!out_file) throw NotFoundError("cannot write --output " + o.output + ": check that its directory exists");
    out = &out_file;
  }
  Predictor predictor(*backend, *out, o.batch_size);
  const std::string source = o.input == "-" ? "stdin" : o.input;
  std::string line;
  for (int64_t line_no = 1; std::getline(*in, line); ++line_no) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const std::string where = source + " line " + std::to_string(line_no) + ": ";
    batch::Instance instance;
    try {
      instance = batch::parse_instance(line, predictor.inputs());
    } catch (const ShapeError& e) {
      throw ShapeError(where + e.what());
    } catch (const UserError& e) {
      throw ValueError(where + e.what());
    }
    predictor.add(std::move(instance), line_no);
  }
  predictor.flush();
  if (out_file.is_open()) {
    out_file.close();
    if (!out_file) throw IOError("writing --output " + o.output + " failed");
  }
}

}  // namespace

Command add_predict_command(CLI::App& app) {
  auto o = std::make_shared<PredictOptions>();
  CLI::App* sub = app.add_subcommand("predict", "Run a saved model on JSON Lines instances");
  sub->add_option("model_dir", o->model_dir, "A model version directory, e.g. models/fashion_mnist/1 (or use --grpc)");
  sub->add_option("--input", o->input, "JSON Lines file of instances, or - for stdin (default)");
  sub->add_option("--output", o->output, "Where to write the predictions (JSON Lines), or - for stdout (default)");
  sub->add_option("--batch_size", o->batch_size, "Instances per batch (per Predict call with --grpc)")
      ->check(positive_integer());
  sub->add_option("--grpc", o->grpc, "HOST:PORT of a model server: send Predict requests there instead of MODEL_DIR");
  sub->add_option("--model_name", o->model_name, "With --grpc: the served model's name");
  sub->add_option("--model_version", o->model_version, "With --grpc: a version (default: the latest)");
  sub->add_option("--version_label", o->version_label, "With --grpc: a version label, e.g. stable");
  sub->add_option("--signature_name", o->signature_name, "With --grpc: the signature (default serving_default)");
  sub->add_option("--ssl_ca", o->ssl_ca, "With --grpc: use TLS, trusting this CA certificate (PEM)");
  sub->add_option("--ssl_client_cert", o->ssl_client_cert,
                  "With --grpc: present this client certificate (PEM; mutual TLS, kiln serve --ssl_client_ca)");
  sub->add_option("--ssl_client_key", o->ssl_client_key, "With --grpc: the private key of --ssl_client_cert (PEM)");
  sub->add_option("--bearer_token_file", o->bearer_token_file, "With --grpc: send the token in this file");
  sub->add_option("--timeout", o->timeout_seconds, "With --grpc: seconds per call (default 60)");
  return {sub, [o] { run_predict(*o); }};
}

}  // namespace kiln::cli
