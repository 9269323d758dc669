// Helpers for bench/serving_bench.sh (the serving benchmark of issue #4):
// model and request set-up, the in-process bound, and load generators for
// REST and gRPC in closed-loop or fixed-rate mode. Every measuring
// subcommand prints one JSON line on stdout.
//
//   serving_bench make_model --out DIR --hidden 2048,2048 [--seed 1] [--dtype_policy bfloat16]
//       784-...-10 MLP (ReLU, softmax), random glorot weights, saved as a
//       kiln model directory (accuracy is irrelevant for throughput).
//   serving_bench make_request --out FILE [--index 0]
//       {"instances": [[784 floats]]}: one Fashion-MNIST test image / 255.
//   serving_bench make_grpc_body --out FILE --model NAME --body FILE [--input_name X] [--check HOST:PORT]
//       The request of `load --grpc` as a gRPC length-prefixed message, for
//       h2load to POST as raw HTTP/2; --check sends it once through the gRPC
//       client first and fails unless the answer is OK.
//   serving_bench bound --model_dir DIR --batch 32 [--seconds 5]
//       ModelServable::predict (what the server's batch threads call) on
//       batches of `batch` rows, one caller: rows per second is the QPS a
//       perfectly batched server could reach with 1-row requests.
//   serving_bench decode --model_dir DIR --body FILE [--seconds 4]
//       A REST predict body decoded as the server's I/O threads decode it:
//       the simdjson fast path, and the DOM path (nlohmann) that takes every
//       body the fast path leaves; microseconds per body (median over runs
//       of 100), one thread. Half the time goes to each path.
//   serving_bench load (--rest|--grpc) HOST:PORT --model NAME --body FILE
//                 [--concurrency 16] [--seconds 8] [--warmup 1] [--rate R]
//       Closed loop (each of `concurrency` clients sends its next request
//       when the last one answered) or, with --rate, fixed rate: request k
//       is due at start + k/R, whichever client is free takes it, and its
//       latency counts from when it was due (so a stalled server is not
//       hidden by the generator waiting for it, as wrk2 does). Reports the
//       generator's own CPU time (all threads) per request too.
//   serving_bench swap --rest HOST:PORT --model NAME --body FILE --base DIR
//                 --source DIR [--swaps 50] [--concurrency 8]
//       Closed-loop REST load while `swaps` new versions are copied into
//       DIR (written under a dot-name, renamed into place) one after the
//       other, each waited for until AVAILABLE. Counts every failed request.
//   serving_bench isolation --rest HOST:PORT --model A --body FILE --rate R
//                 --reload_model B --reload_base DIR --reload_source DIR [--seconds 6]
//       Fixed-rate load on model A, first alone, then while model B is
//       reloaded (new versions copied in) back to back: A's latency both ways.
#include <ATen/ATen.h>
#include <grpcpp/grpcpp.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/core/json.h"
#include "kiln/core/random.h"
#include "kiln/core/threads.h"
#include "kiln/data/datasets.h"
#include "kiln/layers/dense.h"
#include "kiln/models/sequential.h"
#include "kiln/serving/codec/rest_codec.h"
#include "kiln/serving/core/servable.h"
#include "kiln/serving/rest/httplib.h"
#include "tensorflow_serving/apis/prediction_service.grpc.pb.h"

using namespace kiln;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

namespace {

struct Args {
  std::map<std::string, std::string> kv;
  std::string get(const std::string& k, const std::string& def = "") const {
    auto it = kv.find(k);
    return it == kv.end() ? def : it->second;
  }
  std::string need(const std::string& k) const {
    auto it = kv.find(k);
    if (it == kv.end() || it->second.empty()) throw ValueError("serving_bench: --" + k + " is required");
    return it->second;
  }
  double num(const std::string& k, double def) const {
    auto it = kv.find(k);
    if (it == kv.end()) return def;
    try {
      size_t used = 0;
      double v = std::stod(it->second, &used);
      if (used != it->second.size()) throw 0;
      return v;
    } catch (...) {
      throw ValueError("serving_bench: --" + k + " expects a number. Received: " + it->second);
    }
  }
};

// CPU seconds this process used so far, all threads (user + system).
double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto s = [](const timeval& t) { return (double)t.tv_sec + (double)t.tv_usec / 1e6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::pair<std::string, int> host_port(const std::string& s) {
  auto c = s.rfind(':');
  if (c == std::string::npos) throw ValueError("expected HOST:PORT. Received: " + s);
  return {s.substr(0, c), std::stoi(s.substr(c + 1))};
}

// ---- latency bookkeeping ----------------------------------------------------

struct Tally {
  std::vector<int64_t> latencies_us;  // successful requests only
  // Fixed rate: how late the generator itself sent each request (woken
  // after its due time, or its thread still busy with the previous one).
  // Counted in latencies_us too; kept apart to tell the generator's delays
  // from the server's.
  std::vector<int64_t> late_us;
  int64_t ok = 0, failed = 0;
  std::map<std::string, int64_t> failures;  // reason -> count
  void merge(const Tally& o) {
    latencies_us.insert(latencies_us.end(), o.latencies_us.begin(), o.latencies_us.end());
    late_us.insert(late_us.end(), o.late_us.begin(), o.late_us.end());
    ok += o.ok;
    failed += o.failed;
    for (auto& [k, v] : o.failures) failures[k] += v;
  }
};

double percentile_ms(std::vector<int64_t>& v, double p) {
  if (v.empty()) return 0;
  size_t k = std::min(v.size() - 1, (size_t)(p / 100.0 * (double)v.size()));
  std::nth_element(v.begin(), v.begin() + (long)k, v.end());
  return (double)v[k] / 1000.0;
}

Json summary(Tally& t, double seconds) {
  Json failures = Json::object();
  for (auto& [k, v] : t.failures) failures[k] = v;
  Json j{{"ok", t.ok},
         {"failed", t.failed},
         {"failures", failures},
         {"seconds", seconds},
         {"qps", (double)t.ok / seconds},
         {"p50_ms", percentile_ms(t.latencies_us, 50)},
         {"p90_ms", percentile_ms(t.latencies_us, 90)},
         {"p99_ms", percentile_ms(t.latencies_us, 99)},
         {"max_ms", t.latencies_us.empty()
                        ? 0.0
                        : (double)*std::max_element(t.latencies_us.begin(), t.latencies_us.end()) / 1000.0}};
  if (!t.late_us.empty()) {
    j["late_p50_ms"] = percentile_ms(t.late_us, 50);
    j["late_p99_ms"] = percentile_ms(t.late_us, 99);
  }
  return j;
}

// ---- clients: one per load-generator thread ---------------------------------

// One request from one client. Returns "" on success, else a short reason.
class Client {
 public:
  virtual ~Client() = default;
  virtual std::string send() = 0;
};

class RestClient : public Client {
 public:
  RestClient(const std::string& target, const std::string& model, const std::string& body)
      : path_("/v1/models/" + model + ":predict"), body_(body) {
    auto [host, port] = host_port(target);
    c_ = std::make_unique<httplib::Client>(host, port);
    c_->set_keep_alive(true);
    c_->set_tcp_nodelay(true);  // headers and body go out in separate writes
    c_->set_read_timeout(30, 0);
    c_->set_connection_timeout(5, 0);
  }
  std::string send() override {
    auto r = c_->Post(path_.c_str(), body_, "application/json");
    if (!r) return "transport:" + httplib::to_string(r.error());
    if (r->status != 200) return "http_" + std::to_string(r->status);
    return "";
  }

 private:
  std::unique_ptr<httplib::Client> c_;
  std::string path_, body_;
};

// One row as a PredictRequest (tensor_content): what GrpcClient sends and
// what make_grpc_body frames for h2load.
tensorflow::serving::PredictRequest predict_request(const std::string& model, const std::vector<float>& row,
                                                    const std::string& input_name) {
  tensorflow::serving::PredictRequest req;
  req.mutable_model_spec()->set_name(model);
  auto& t = (*req.mutable_inputs())[input_name];
  t.set_dtype(tensorflow::DT_FLOAT);
  t.mutable_tensor_shape()->add_dim()->set_size(1);
  t.mutable_tensor_shape()->add_dim()->set_size((int64_t)row.size());
  t.set_tensor_content(std::string(reinterpret_cast<const char*>(row.data()), row.size() * sizeof(float)));
  return req;
}

class GrpcClient : public Client {
 public:
  GrpcClient(const std::string& target, const std::string& model, const std::vector<float>& row,
             const std::string& input_name, int channel_id)
      : req_(predict_request(model, row, input_name)) {
    grpc::ChannelArguments a;
    a.SetInt("kiln.bench.channel", channel_id);  // distinct args: a connection per client
    stub_ = tensorflow::serving::PredictionService::NewStub(
        grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), a));
  }
  std::string send() override {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    tensorflow::serving::PredictResponse resp;
    grpc::Status s = stub_->Predict(&ctx, req_, &resp);
    if (!s.ok()) return "grpc_" + std::to_string((int)s.error_code());
    return "";
  }

 private:
  std::unique_ptr<tensorflow::serving::PredictionService::Stub> stub_;
  tensorflow::serving::PredictRequest req_;
};

struct Body {
  std::string json;        // the REST body
  std::vector<float> row;  // its one row, for gRPC
};

Body read_body(const std::string& path) {
  Body b;
  b.json = read_file(path);
  Json j = Json::parse(b.json);
  if (!j.contains("instances") || !j["instances"].is_array() || j["instances"].size() != 1)
    throw ValueError(path + ": expected {\"instances\": [[...one row...]]}");
  for (auto& v : j["instances"][0]) b.row.push_back(v.get<float>());
  return b;
}

using ClientFactory = std::function<std::unique_ptr<Client>(int)>;

ClientFactory client_factory(const Args& a, const Body& body) {
  std::string model = a.need("model");
  if (!a.get("rest").empty()) {
    std::string target = a.get("rest");
    return [=](int) { return std::make_unique<RestClient>(target, model, body.json); };
  }
  std::string target = a.need("grpc"), input = a.get("input_name", "inputs");
  return [=](int id) { return std::make_unique<GrpcClient>(target, model, body.row, input, id); };
}

// Runs `concurrency` clients until `stop` is set (or, when `duration` > 0,
// for that long). rate > 0: fixed-rate schedule, else closed loop.
Tally drive(const ClientFactory& make, int concurrency, double duration, double rate,
            std::atomic<bool>* stop = nullptr) {
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < concurrency; ++i) clients.push_back(make(i));
  std::vector<Tally> tallies(concurrency);
  std::atomic<int64_t> next{0};
  auto t0 = Clock::now();
  auto end = duration > 0 ? t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(duration))
                          : Clock::time_point::max();
  auto over = [&](Clock::time_point now) { return now >= end || (stop && stop->load()); };
  std::vector<std::thread> threads;
  for (int i = 0; i < concurrency; ++i)
    threads.emplace_back([&, i] {
      Tally& t = tallies[i];
      t.latencies_us.reserve(1 << 16);
      for (;;) {
        Clock::time_point start;
        if (rate > 0) {
          int64_t k = next.fetch_add(1);
          start = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>((double)k / rate));
          if (over(start)) break;
          std::this_thread::sleep_until(start);
          if (stop && stop->load()) break;
          t.late_us.push_back(std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count());
        } else {
          start = Clock::now();
          if (over(start)) break;
        }
        std::string err = clients[i]->send();
        if (err.empty()) {
          ++t.ok;
          t.latencies_us.push_back(std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count());
        } else {
          ++t.failed;
          ++t.failures[err];
        }
      }
    });
  for (auto& th : threads) th.join();
  Tally all;
  for (auto& t : tallies) all.merge(t);
  return all;
}

// ---- model repository helpers -------------------------------------------------

// Copies `source` into `base`/<version> the way a deployment should: under a
// dot-name first, then one rename.
void deploy_version(const std::string& source, const std::string& base, int64_t version) {
  std::string tmp = base + "/.incoming-" + std::to_string(version);
  fs::remove_all(tmp);
  fs::copy(source, tmp, fs::copy_options::recursive);
  fs::rename(tmp, base + "/" + std::to_string(version));
}

int64_t latest_version_on_disk(const std::string& base) {
  int64_t v = 0;
  for (auto& name : list_directory(base))
    if (!name.empty() && std::all_of(name.begin(), name.end(), ::isdigit)) v = std::max<int64_t>(v, std::stoll(name));
  return v;
}

// Waits until `version` of `model` is AVAILABLE (REST status route); seconds taken.
double wait_available(httplib::Client& c, const std::string& model, int64_t version, double timeout_s) {
  auto t0 = Clock::now();
  const std::string path = "/v1/models/" + model + "/versions/" + std::to_string(version);
  while (seconds_since(t0) < timeout_s) {
    auto r = c.Get(path.c_str());
    if (r && r->status == 200 && r->body.find("AVAILABLE") != std::string::npos) return seconds_since(t0);
    if (r && r->status == 200 && r->body.find("\"END\"") != std::string::npos)
      throw IOError(model + " version " + std::to_string(version) + " failed to load: " + r->body);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  throw IOError(model + " version " + std::to_string(version) + " not AVAILABLE within " + std::to_string(timeout_s) +
                " s");
}

// ---- subcommands ----------------------------------------------------------------

int make_model(const Args& a) {
  set_random_seed((uint64_t)a.num("seed", 1));
  set_dtype_policy(a.get("dtype_policy", "float32"));  // e.g. bfloat16: bf16 weights
  auto m = models::Sequential();
  m->add(layers::Input({784}));
  std::stringstream ss(a.get("hidden", "2048,2048"));
  std::string units;
  while (std::getline(ss, units, ',')) m->add(layers::Dense(std::stoll(units), "relu"));
  m->add(layers::Dense(10, "softmax"));
  std::string out = a.need("out");
  make_dirs(parent_path(out));
  m->save(out);
  int64_t params = 0;
  for (auto& w : m->weights()) params += w->value().numel();
  std::cout << Json{{"model_dir", out}, {"parameters", params}}.dump() << std::endl;
  return 0;
}

int make_request(const Args& a) {
  auto data = datasets::fashion_mnist();
  int64_t i = (int64_t)a.num("index", 0);
  at::Tensor img = data.x_test[i].reshape({-1}).to(at::kFloat).div(255.0f).contiguous();
  std::string s = "{\"instances\": [[";
  char buf[32];
  for (int64_t k = 0; k < img.numel(); ++k) {
    std::snprintf(buf, sizeof buf, "%s%.6g", k ? "," : "", img.data_ptr<float>()[k]);
    s += buf;
  }
  s += "]]}";
  atomic_write_file(a.need("out"), s);
  return 0;
}

// Writes the body of one gRPC Predict call as it goes on the wire (the
// length-prefixed message: 1 byte "not compressed", 4 bytes big-endian
// length, the serialized PredictRequest) for h2load to POST as raw HTTP/2.
// With --check HOST:PORT it first sends the same request through the gRPC
// client and fails unless the answer is OK, so the bytes are known good.
int make_grpc_body(const Args& a) {
  Body body = read_body(a.need("body"));
  auto req = predict_request(a.need("model"), body.row, a.get("input_name", "inputs"));
  if (!a.get("check").empty()) {
    auto stub = tensorflow::serving::PredictionService::NewStub(
        grpc::CreateChannel(a.get("check"), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    tensorflow::serving::PredictResponse resp;
    grpc::Status s = stub->Predict(&ctx, req, &resp);
    if (!s.ok())
      throw IOError("gRPC Predict on " + a.get("check") + " failed: code " + std::to_string((int)s.error_code()) +
                    ": " + s.error_message());
  }
  std::string msg = req.SerializeAsString();
  std::string frame(5, '\0');
  for (int i = 0; i < 4; ++i) frame[1 + i] = (char)((msg.size() >> (8 * (3 - i))) & 0xff);
  atomic_write_file(a.need("out"), frame + msg);
  std::cout << Json{{"out", a.need("out")}, {"message_bytes", msg.size()}}.dump() << std::endl;
  return 0;
}

int bound(const Args& a) {
  serving::ModelServable servable(a.need("model_dir"));
  int64_t batch = (int64_t)a.num("batch", 32);
  double seconds = a.num("seconds", 5);
  std::string input = servable.signatures()[serving::kDefaultSignature]["inputs"].begin().key();
  Body body = read_body(a.need("body"));
  at::Tensor row = at::from_blob(body.row.data(), {1, (int64_t)body.row.size()}, at::kFloat).clone();
  serving::TensorMap in{{input, row.repeat({batch, 1})}};
  for (int i = 0; i < 20; ++i) servable.predict(in, "");  // warm caches and oneDNN primitives
  std::vector<int64_t> per_batch_us;
  int64_t batches = 0;
  auto t0 = Clock::now();
  while (seconds_since(t0) < seconds) {
    auto s = Clock::now();
    servable.predict(in, "");
    per_batch_us.push_back(std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - s).count());
    ++batches;
  }
  double elapsed = seconds_since(t0);
  std::cout << Json{{"batch", batch},
                    {"batches", batches},
                    {"rows_per_s", (double)(batches * batch) / elapsed},
                    {"batch_p50_ms", percentile_ms(per_batch_us, 50)},
                    {"threads", num_threads()}}
                   .dump()
            << std::endl;
  return 0;
}

int decode(const Args& a) {
  serving::ModelServable servable(a.need("model_dir"));
  const Json& signatures = servable.signatures();
  const std::string text = read_file(a.need("body"));
  const double seconds = a.num("seconds", 4);
  serving::PredictCall first;
  if (!serving::decode_predict_fast(text, signatures, &first))
    throw ValueError(
        "serving_bench decode: the fast path leaves this body to the DOM path; give a plain "
        "{\"instances\": [[numbers]]} body for the model's one input");
  auto median_us = [&](auto once) {
    std::vector<double> us;
    auto t0 = Clock::now();
    while (seconds_since(t0) < seconds / 2) {
      auto s = Clock::now();
      for (int i = 0; i < 100; ++i) once();
      us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - s).count() / 100);
    }
    std::nth_element(us.begin(), us.begin() + us.size() / 2, us.end());
    return us[us.size() / 2];
  };
  double fast = median_us([&] {
    serving::PredictCall c;
    serving::decode_predict_fast(text, signatures, &c);
  });
  double dom = median_us([&] { serving::decode_predict_request(serving::parse_request_json(text, 100), signatures); });
  std::cout << Json{{"body_bytes", text.size()},
                    {"values", first.inputs.begin()->second.numel()},
                    {"fast_us", fast},
                    {"dom_us", dom}}
                   .dump()
            << std::endl;
  return 0;
}

int load(const Args& a) {
  Body body = read_body(a.need("body"));
  ClientFactory make = client_factory(a, body);
  int c = (int)a.num("concurrency", 16);
  double rate = a.num("rate", 0);
  double warmup = a.num("warmup", 1);
  if (warmup > 0) drive(make, c, warmup, rate);
  double seconds = a.num("seconds", 8);
  auto t0 = Clock::now();
  double cpu0 = process_cpu_seconds();
  Tally t = drive(make, c, seconds, rate);
  double cpu = process_cpu_seconds() - cpu0;
  Json j = summary(t, seconds_since(t0));
  j["concurrency"] = c;
  j["rate"] = rate;
  // The generator's own cost: it shares the cores with the server.
  j["generator_cpu_s"] = cpu;
  j["generator_cpu_us_per_request"] = t.ok + t.failed > 0 ? cpu * 1e6 / (double)(t.ok + t.failed) : 0.0;
  std::cout << j.dump() << std::endl;
  return 0;
}

int swap(const Args& a) {
  Body body = read_body(a.need("body"));
  ClientFactory make = client_factory(a, body);
  std::string model = a.need("model"), base = a.need("base"), source = a.need("source");
  int swaps = (int)a.num("swaps", 50);
  auto [host, port] = host_port(a.need("rest"));
  httplib::Client status(host, port);
  std::atomic<bool> stop{false};
  Tally t;
  auto t0 = Clock::now();
  std::thread loader([&] { t = drive(make, (int)a.num("concurrency", 8), 0, 0, &stop); });
  std::vector<int64_t> swap_us;
  std::string error;
  try {
    int64_t v = latest_version_on_disk(base);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // load is flowing before the first swap
    for (int i = 0; i < swaps; ++i) {
      ++v;
      auto s = Clock::now();
      deploy_version(source, base, v);
      wait_available(status, model, v, 60);
      swap_us.push_back(std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - s).count());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the last old version unloads under load
  } catch (const std::exception& e) {
    error = e.what();
  }
  stop = true;
  loader.join();
  Json j = summary(t, seconds_since(t0));
  j["swaps"] = swap_us.size();
  j["swap_p50_ms"] = percentile_ms(swap_us, 50);
  j["swap_max_ms"] = swap_us.empty() ? 0.0 : (double)*std::max_element(swap_us.begin(), swap_us.end()) / 1000.0;
  if (!error.empty()) j["error"] = error;
  std::cout << j.dump() << std::endl;
  return error.empty() ? 0 : 1;
}

int isolation(const Args& a) {
  Body body = read_body(a.need("body"));
  ClientFactory make = client_factory(a, body);
  int c = (int)a.num("concurrency", 8);
  double rate = a.num("rate", 200), seconds = a.num("seconds", 6);
  std::string model_b = a.need("reload_model"), base = a.need("reload_base"), source = a.need("reload_source");
  auto [host, port] = host_port(a.need("rest"));
  drive(make, c, 1, rate);  // warm-up
  Tally quiet = drive(make, c, seconds, rate);
  std::atomic<bool> stop{false};
  int reloads = 0;
  std::string error;
  std::vector<int64_t> reload_us;
  std::thread reloader([&, host = host, port = port] {  // C++17 (the clang build): no capture of structured bindings
    try {
      httplib::Client status(host, port);
      int64_t v = latest_version_on_disk(base);
      while (!stop) {
        ++v;
        auto s = Clock::now();
        deploy_version(source, base, v);
        wait_available(status, model_b, v, 60);
        reload_us.push_back(std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - s).count());
        ++reloads;
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  Tally busy = drive(make, c, seconds, rate);
  stop = true;
  reloader.join();
  Json j{{"rate", rate},
         {"quiet", summary(quiet, seconds)},
         {"reloading", summary(busy, seconds)},
         {"reloads", reloads},
         {"reload_p50_ms", percentile_ms(reload_us, 50)}};
  if (!error.empty()) j["error"] = error;
  std::cout << j.dump() << std::endl;
  return error.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  prepare_thread_environment(argv);
  if (argc < 2) {
    std::cerr << "usage: serving_bench make_model|make_request|make_grpc_body|bound|decode|load|swap|isolation --flag "
                 "value ...\n";
    return 2;
  }
  std::string cmd = argv[1];
  Args a;
  for (int i = 2; i < argc; ++i) {
    std::string k = argv[i];
    if (k.rfind("--", 0) != 0) {
      std::cerr << "serving_bench: expected --flag, got " << k << "\n";
      return 2;
    }
    k = k.substr(2);
    auto eq = k.find('=');
    if (eq != std::string::npos)
      a.kv[k.substr(0, eq)] = k.substr(eq + 1);
    else
      a.kv[k] = i + 1 < argc ? argv[++i] : "";
  }
  try {
    // The bound runs with the server's thread set-up; the generators need no
    // intra-op threads (they only wait on sockets).
    configure_threads(ThreadConfig{cmd == "bound" || cmd == "make_model" ? 0 : 1});
    if (cmd == "make_model") return make_model(a);
    if (cmd == "make_request") return make_request(a);
    if (cmd == "make_grpc_body") return make_grpc_body(a);
    if (cmd == "bound") return bound(a);
    if (cmd == "decode") return decode(a);
    if (cmd == "load") return load(a);
    if (cmd == "swap") return swap(a);
    if (cmd == "isolation") return isolation(a);
    std::cerr << "serving_bench: unknown subcommand " << cmd << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "serving_bench " << cmd << ": error: " << e.what() << "\n";
    return 1;
  }
}
