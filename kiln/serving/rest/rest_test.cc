#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <thread>

#include "kiln/core/base64.h"
#include "kiln/serving/codec/rest_codec.h"
#include "kiln/serving/serving_test_util.h"

namespace kiln::serving {
namespace {

using namespace kiln::serving::testing;

class Rest : public ::testing::Test {
 protected:
  void SetUp() override {
    save_tiny_model(dir_.path() + "/m/1", 0.5f);
    save_tiny_model(dir_.path() + "/m/2", 1.0f);
    ServerCoreOptions o;
    ModelConfig m = model_config("m", dir_.path() + "/m");
    m.version_policy.kind = VersionPolicy::Kind::kAll;
    m.version_labels = {{"stable", 1}, {"canary", 2}};
    o.config.models = {m};
    o.file_system_poll_wait_seconds = 0;
    FrontendOptions f;
    f.max_body_bytes = 1 << 20;
    served_ = std::make_unique<Served>(o, f);
    cli_ = served_->client();
    in_ = input_name(*served_->core->get({"m"}));
  }
  Json post(const std::string& path, const std::string& body, int* status) {
    auto r = cli_->Post(path.c_str(), body, "application/json");
    EXPECT_TRUE(r) << path;
    if (!r) return Json();
    *status = r->status;
    return Json::parse(r->body, nullptr, false);
  }
  Json get(const std::string& path, int* status) {
    auto r = cli_->Get(path.c_str());
    EXPECT_TRUE(r) << path;
    if (!r) return Json();
    *status = r->status;
    return Json::parse(r->body, nullptr, false);
  }
  // 400 with an "error" message containing `part`.
  void expect_400(const std::string& path, const std::string& body, const std::string& part) {
    int st = 0;
    Json j = post(path, body, &st);
    EXPECT_EQ(st, 400) << body.substr(0, 200);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << j.dump();
    EXPECT_NE(j["error"].get<std::string>().find(part), std::string::npos) << j["error"];
  }

  TempDir dir_;
  std::unique_ptr<Served> served_;
  std::unique_ptr<httplib::Client> cli_;
  std::string in_;
};

TEST_F(Rest, ModelStatusIsTfServingJson) {
  int st = 0;
  Json j = get("/v1/models/m", &st);
  EXPECT_EQ(st, 200);
  EXPECT_EQ(j, Json::parse(R"({"model_version_status":[
    {"version":"2","state":"AVAILABLE","status":{"error_code":"OK","error_message":""}},
    {"version":"1","state":"AVAILABLE","status":{"error_code":"OK","error_message":""}}]})"));
  j = get("/v1/models/m/versions/1", &st);
  EXPECT_EQ(st, 200);
  ASSERT_EQ(j["model_version_status"].size(), 1u);
  EXPECT_EQ(j["model_version_status"][0]["version"], "1");
  j = get("/v1/models/m/labels/canary", &st);
  EXPECT_EQ(j["model_version_status"][0]["version"], "2");
  get("/v1/models/nope", &st);
  EXPECT_EQ(st, 404);
  j = get("/v1/models/m/versions/7", &st);
  EXPECT_EQ(st, 404);
  EXPECT_TRUE(j.contains("error"));
  j = get("/v1/models/m/labels/beta", &st);
  EXPECT_EQ(st, 404);
  EXPECT_NE(j["error"].get<std::string>().find("beta"), std::string::npos);
}

TEST_F(Rest, MetadataIsTfServingSignatureDef) {
  int st = 0;
  Json j = get("/v1/models/m/versions/1/metadata", &st);
  EXPECT_EQ(st, 200);
  EXPECT_EQ(j["model_spec"]["name"], "m");
  EXPECT_EQ(j["model_spec"]["version"], "1");
  const Json& sig = j["metadata"]["signature_def"]["signature_def"]["serving_default"];
  EXPECT_EQ(sig["method_name"], "tensorflow/serving/predict");
  EXPECT_EQ(sig["inputs"][in_]["dtype"], "DT_FLOAT");
  EXPECT_EQ(sig["inputs"][in_]["tensor_shape"]["dim"][0]["size"], "-1");
  EXPECT_EQ(sig["inputs"][in_]["tensor_shape"]["dim"][1]["size"], "4");
}

TEST_F(Rest, PredictRowAndColumnarFormatsWithVersionsAndLabels) {
  int st = 0;
  Json j = post("/v1/models/m:predict", R"({"instances": [[1,2,3,4], [0,0,0,0]]})", &st);
  ASSERT_EQ(st, 200) << j.dump();
  // Latest is version 2 (fill 1.0): 10 + 1.
  ASSERT_EQ(j["predictions"].size(), 2u);
  EXPECT_FLOAT_EQ(j["predictions"][0][0].get<float>(), tiny_output(1.0f, {1, 2, 3, 4}));
  EXPECT_FLOAT_EQ(j["predictions"][1][2].get<float>(), 1.0f);
  j = post("/v1/models/m/labels/stable:predict", R"({"instances": [[1,2,3,4]]})", &st);
  EXPECT_FLOAT_EQ(j["predictions"][0][0].get<float>(), tiny_output(0.5f, {1, 2, 3, 4}));
  j = post("/v1/models/m/versions/1:predict",
           R"({"signature_name": "serving_default", "inputs": {")" + in_ + R"(": [[1,1,1,1]]}})", &st);
  ASSERT_EQ(st, 200) << j.dump();
  EXPECT_FLOAT_EQ(j["outputs"][0][1].get<float>(), tiny_output(0.5f, {1, 1, 1, 1}));
  j = post("/v1/models/m:predict", R"({"inputs": [[1,1,1,1]]})", &st);
  EXPECT_EQ(st, 200);
  // Named row format.
  j = post("/v1/models/m:predict", R"({"instances": [{")" + in_ + R"(": [1,1,1,1]}]})", &st);
  EXPECT_EQ(st, 200) << j.dump();
}

TEST_F(Rest, AcceptsNaNInfinityAndBase64) {
  int st = 0;
  {
    auto r = cli_->Post("/v1/models/m:predict", R"({"instances": [[NaN, 0, 0, 0], [Infinity, -Infinity, 0, 1]]})",
                        "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    // NaN out, written as TF Serving writes it: a bare NaN token.
    EXPECT_EQ(r->body.rfind("{\"predictions\":[[NaN", 0), 0u) << r->body;
    EXPECT_EQ(parse_request_json(r->body, 64)["predictions"][0][0], "NaN");
  }
  Json j;
  float x[4] = {1, 2, 3, 4};
  std::string raw(reinterpret_cast<char*>(x), sizeof x);
  static const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string b64;
  for (size_t i = 0; i < raw.size(); i += 3) {
    uint32_t n = (uint8_t)raw[i] << 16 | (i + 1 < raw.size() ? (uint8_t)raw[i + 1] << 8 : 0) |
                 (i + 2 < raw.size() ? (uint8_t)raw[i + 2] : 0);
    b64 += a[n >> 18 & 63];
    b64 += a[n >> 12 & 63];
    b64 += i + 1 < raw.size() ? a[n >> 6 & 63] : '=';
    b64 += i + 2 < raw.size() ? a[n & 63] : '=';
  }
  j = post("/v1/models/m:predict", R"({"instances": [{"b64": ")" + b64 + R"("}]})", &st);
  ASSERT_EQ(st, 200) << j.dump();
  EXPECT_FLOAT_EQ(j["predictions"][0][0].get<float>(), tiny_output(1.0f, {1, 2, 3, 4}));
  EXPECT_EQ(base64_decode("aGVsbG8="), "hello");
  EXPECT_EQ(base64_decode("aGVsbG8"), "hello");
}

TEST_F(Rest, MalformedRequestsGetA400AndNeverWedgeTheServer) {
  expect_400("/v1/models/m:predict", R"({"instances": [[1,2,3,4])", "JSON Parse error");  // truncated
  expect_400("/v1/models/m:predict", "", "JSON Parse error");
  expect_400("/v1/models/m:predict", R"({"instances": [[1,2,3]]})", "expects shape");
  expect_400("/v1/models/m:predict", R"({"instances": [[1,2,3,4],[1,2]]})", "disagree");
  expect_400("/v1/models/m:predict", R"({"instances": [["a",2,3,4]]})", "expects dtype float32. Received: string");
  expect_400("/v1/models/m:predict", R"({"instances": [[[1,2],[3,4]]]})", "expects shape");
  expect_400("/v1/models/m:predict", R"({"instances": [{"b64": "!!!"}]})", "invalid base64");
  expect_400("/v1/models/m:predict", R"({"instances": [{"b64": "AAAA"}]})", "values");
  expect_400("/v1/models/m:predict", R"({"instances": [[1,2,3,4]], "inputs": [[1,2,3,4]]})", "exactly one");
  expect_400("/v1/models/m:predict", R"({"instances": [[1,2,3,4]], "signature_name": "nope"})", "nope");
  expect_400("/v1/models/m:predict", R"([1,2])", "JSON object");
  expect_400("/v1/models/m:predict", std::string(100000, '[') + std::string(100000, ']'), "nesting");
  expect_400("/v1/models/m:classify", R"({"examples": [{"x": [1,2,3,4]}], "signature_name": "nope"})", "nope");
  expect_400("/v1/models/m:classify", R"({"examples": []})", "non-empty list");
  int st = 0;
  post("/v1/models/nope:predict", R"({"instances": [[1,2,3,4]]})", &st);
  EXPECT_EQ(st, 404);
  post("/v1/models/m/versions/9:predict", R"({"instances": [[1,2,3,4]]})", &st);
  EXPECT_EQ(st, 404);
  // Too large a body: 413 from the size limit.
  auto r = cli_->Post("/v1/models/m:predict", std::string(2 << 20, ' '), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
  // Still serving.
  Json j = post("/v1/models/m:predict", R"({"instances": [[1,2,3,4]]})", &st);
  EXPECT_EQ(st, 200);
  r = cli_->Get("/v1/nothing");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
}

TEST_F(Rest, KServeV2HealthMetadataReadyAndInfer) {
  int st = 0;
  get("/v2/health/live", &st);
  EXPECT_EQ(st, 200);
  get("/v2/health/ready", &st);
  EXPECT_EQ(st, 200);
  Json j = get("/v2/models/m", &st);
  EXPECT_EQ(st, 200);
  EXPECT_EQ(j["name"], "m");
  EXPECT_EQ(j["versions"], Json::parse(R"(["2", "1"])"));  // every available version, newest first (as gRPC)
  EXPECT_EQ(j["inputs"][0]["datatype"], "FP32");
  EXPECT_EQ(j["inputs"][0]["shape"], Json::parse("[-1, 4]"));
  get("/v2/models/m/versions/1/ready", &st);
  EXPECT_EQ(st, 200);
  get("/v2/models/m/versions/5/ready", &st);
  EXPECT_EQ(st, 404);
  get("/v2/models/zzz/ready", &st);
  EXPECT_EQ(st, 404);
  j = post("/v2/models/m/versions/1/infer",
           R"({"id": "r1", "inputs": [{"name": ")" + in_ +
               R"(", "shape": [2, 4], "datatype": "FP32", "data": [1,2,3,4,0,0,0,0]}]})",
           &st);
  ASSERT_EQ(st, 200) << j.dump();
  EXPECT_EQ(j["id"], "r1");
  EXPECT_EQ(j["model_version"], "1");
  EXPECT_EQ(j["outputs"][0]["shape"], Json::parse("[2, 3]"));
  EXPECT_EQ(j["outputs"][0]["datatype"], "FP32");
  EXPECT_FLOAT_EQ(j["outputs"][0]["data"][0].get<float>(), tiny_output(0.5f, {1, 2, 3, 4}));
  expect_400("/v2/models/m/infer",
             R"({"inputs": [{"name": ")" + in_ + R"(", "shape": [1, 4], "datatype": "INT64", "data": [1,2,3,4]}]})",
             "datatype INT64");
  expect_400("/v2/models/m/infer",
             R"({"inputs": [{"name": ")" + in_ + R"(", "shape": [2, 4], "datatype": "FP32", "data": [1,2,3,4]}]})",
             "holds 8 values");
  expect_400("/v2/models/m/infer", R"({"inputs": 3})", "inputs");
}

TEST_F(Rest, PrometheusMetricsCountRequestsPerModelVersionAndPhase) {
  int st = 0;
  post("/v1/models/m/versions/1:predict", R"({"instances": [[1,2,3,4]]})", &st);
  ASSERT_EQ(st, 200);
  for (const char* path : {"/monitoring/prometheus/metrics", "/metrics"}) {
    auto r = cli_->Get(path);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    const std::string& b = r->body;
    EXPECT_NE(b.find("kiln_requests_total{api=\"predict\",code=\"OK\",model=\"m\",protocol=\"rest\",version=\"1\"} 1"),
              std::string::npos)
        << b;
    EXPECT_NE(b.find("kiln_request_latency_seconds_bucket{model=\"m\",phase=\"compute\",protocol=\"rest\",version="
                     "\"1\",le=\"+Inf\"} 1"),
              std::string::npos);
    EXPECT_NE(b.find("phase=\"parse\""), std::string::npos);
    EXPECT_NE(b.find("phase=\"serialize\""), std::string::npos);
    EXPECT_NE(b.find("kiln_model_load_seconds_count{model=\"m\"} 2"), std::string::npos);
    EXPECT_NE(b.find("kiln_model_version_available{model=\"m\",version=\"2\"} 1"), std::string::npos);
    EXPECT_NE(b.find("process_resident_memory_bytes "), std::string::npos);
  }
}

// httplib's default socket options set SO_REUSEPORT, so a second server on
// the same port bound too and silently took half the traffic.
TEST_F(Rest, ASecondServerOnTheSamePortFailsToBind) {
  FrontendOptions f;
  f.port = served_->port;
  RestServer second(*served_->core, f);
  try {
    second.start();
    FAIL() << "a second REST server bound port " << served_->port;
  } catch (const IOError& e) {
    EXPECT_NE(std::string(e.what()).find("--rest_api_port"), std::string::npos) << e.what();
  }
  int st = 0;
  Json j = post("/v1/models/m:predict", R"({"instances": [[1, 2, 3, 4]]})", &st);  // the first still serves
  EXPECT_EQ(st, 200) << j.dump();
}

// An open keep-alive connection holds a REST thread. With a fixed pool of
// num_threads, a client beyond that waited for an idle connection to time
// out (5 s); the pool now grows, so it is answered at once.
// Classify/Regress share one implementation with gRPC (kiln/serving/codec/inference.h):
// a predict-method signature is classified by its output columns.
TEST_F(Rest, ClassifyScoresArePredictOutputsAndRegressNeedsOneValue) {
  int st = 0;
  std::string ex = R"({"examples": [{")" + in_ + R"(": [1,2,3,4]}, {")" + in_ + R"(": [0,1,0,1]}]})";
  Json c = post("/v1/models/m:classify", ex, &st);
  ASSERT_EQ(st, 200) << c.dump();
  Json p = post("/v1/models/m:predict", R"({"instances": [[1,2,3,4], [0,1,0,1]]})", &st);
  ASSERT_EQ(st, 200) << p.dump();
  ASSERT_EQ(c["result"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    Json row = p["predictions"][i].is_array() ? p["predictions"][i] : Json::array({p["predictions"][i]});
    ASSERT_EQ(c["result"][i].size(), row.size());
    for (size_t k = 0; k < row.size(); ++k) {
      EXPECT_EQ(c["result"][i][k][0], std::to_string(k));
      EXPECT_NEAR(c["result"][i][k][1].get<double>(), row[k].get<double>(), 1e-6);
    }
  }
  if (p["predictions"][0].is_array() && p["predictions"][0].size() > 1)
    expect_400("/v1/models/m:regress", ex, "one value per example");
}

// The server is event-driven: a few I/O threads serve every connection, so
// many more open keep-alive connections than threads are all answered, at
// once and again later on the same connections.
// KServe's binary tensor data extension is refused by name, before the JSON
// parse would fail on the raw bytes after the header.
TEST_F(Rest, KServeBinaryExtensionIsRefusedByName) {
  std::string json = R"({"inputs": [{"name": ")" + in_ + R"(", "shape": [1, 4], "datatype": "FP32"}]})";
  std::string body = json + std::string(16, '\0');
  httplib::Headers h{{"Inference-Header-Content-Length", std::to_string(json.size())}};
  auto r = cli_->Post("/v2/models/m/infer", h, body, "application/octet-stream");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("binary tensor data extension"), std::string::npos) << r->body;
}

TEST(RestThreads, MoreOpenConnectionsThanThreadsAllGetAnswers) {
  TempDir dir;
  save_tiny_model(dir.path() + "/m/1", 1.0f);
  ServerCoreOptions o;
  o.config.models = {model_config("m", dir.path() + "/m")};
  o.file_system_poll_wait_seconds = 0;
  FrontendOptions f;
  f.num_threads = 2;
  Served served(o, f);
  std::vector<std::unique_ptr<httplib::Client>> clients;
  for (int i = 0; i < 48; ++i) {
    auto c = served.client();
    c->set_keep_alive(true);
    c->set_read_timeout(3, 0);
    auto r = c->Post("/v1/models/m:predict", R"({"instances": [[1, 2, 3, 4]]})", "application/json");
    ASSERT_TRUE(r) << "client " << i << " got no answer while " << i << " idle connections were open";
    EXPECT_EQ(r->status, 200) << r->body;
    clients.push_back(std::move(c));  // its connection stays open
  }
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (auto& c : clients)  // and each still answers on its own connection, all at once
    threads.emplace_back([&c, &ok] {
      auto r = c->Get("/v1/models/m");
      if (r && r->status == 200) ++ok;
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 48);
  for (auto& c : clients) c->stop();
}

// A raw HTTP/1.1 exchange on one connection: sends `request`, reads until
// `answers` responses' status lines arrived (or the server closed / 10 s).
std::string raw_exchange(int port, const std::string& request, int answers = 1) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return "";
  }
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string got;
  char buf[4096];
  auto count = [&] {
    int n = 0;
    for (size_t at = got.find("HTTP/1.1 "); at != std::string::npos; at = got.find("HTTP/1.1 ", at + 1)) ++n;
    return n;
  };
  while (count() < answers || got.find("\r\n\r\n", got.rfind("HTTP/1.1 ")) == std::string::npos) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return got;
}

// Bodies are JSON whatever the Content-Type says (as TF Serving): a large
// body sent as a form (curl -d) is a predict request like any other, and the
// default limit is 64 MiB, refused from the Content-Length before any of the
// body is sent.
TEST(RestBody, FormContentTypeIsJsonAndTheDefaultLimitIs64MiB) {
  TempDir dir;
  save_tiny_model(dir.path() + "/m/1", 1.0f);
  ServerCoreOptions o;
  o.config.models = {model_config("m", dir.path() + "/m")};
  o.file_system_poll_wait_seconds = 0;
  Served served(o);
  EXPECT_EQ(FrontendOptions{}.max_body_bytes, size_t{64} << 20);
  std::string body = R"({"instances": [)";
  const int rows = 12000;
  for (int i = 0; i < rows; ++i) body += std::string(i ? ", " : "") + "[1, 2, 3, 4]";
  body += "]}";
  ASSERT_GT(body.size(), 100u << 10);
  auto c = served.client();
  auto r = c->Post("/v1/models/m:predict", body, "application/x-www-form-urlencoded");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body.substr(0, 300);
  EXPECT_EQ(Json::parse(r->body)["predictions"].size(), static_cast<size_t>(rows));
  std::string at_limit = raw_exchange(served.port,
                                      "POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\nContent-Type: "
                                      "application/json\r\nContent-Length: " +
                                          std::to_string((64 << 20) + 1) + "\r\n\r\n");
  EXPECT_EQ(at_limit.rfind("HTTP/1.1 413", 0), 0u) << at_limit;
  EXPECT_NE(at_limit.find("request body too large"), std::string::npos) << at_limit;
}

// Requests sent back to back on one connection are answered in order; a
// chunked body is counted against the limit as it arrives.
TEST_F(Rest, PipelinedRequestsAndChunkedBodies) {
  std::string got = raw_exchange(served_->port,
                                 "GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
                                 "GET /v1/nothing HTTP/1.1\r\nHost: x\r\n\r\n"
                                 "GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n",
                                 3);
  size_t a = got.find("HTTP/1.1 200"), b = got.find("HTTP/1.1 404"), c = got.find("HTTP/1.1 200", a + 1);
  ASSERT_NE(a, std::string::npos) << got;
  ASSERT_NE(b, std::string::npos) << got;
  ASSERT_NE(c, std::string::npos) << got;
  EXPECT_LT(a, b);
  EXPECT_LT(b, c);
  EXPECT_NE(got.find("\"live\":true"), std::string::npos) << got;
  EXPECT_NE(got.find("\"ready\":true"), std::string::npos) << got;
  // 1 MiB limit (the fixture): two 600 KB chunks exceed it.
  std::string chunk(600 << 10, ' ');
  std::string chunked = "POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  char size[32];
  std::snprintf(size, sizeof(size), "%zx\r\n", chunk.size());
  for (int i = 0; i < 2; ++i) chunked += size + chunk + "\r\n";
  chunked += "0\r\n\r\n";
  got = raw_exchange(served_->port, chunked);
  EXPECT_EQ(got.rfind("HTTP/1.1 413", 0), 0u) << got.substr(0, 200);
  // A small chunked body is a request like any other.
  std::string req = R"({"instances": [[1, 2, 3, 4]]})";
  std::snprintf(size, sizeof(size), "%zx\r\n", req.size());
  got = raw_exchange(served_->port,
                     "POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
                         std::string(size) + req + "\r\n0\r\n\r\n");
  EXPECT_EQ(got.rfind("HTTP/1.1 200", 0), 0u) << got;
}

// stop() while batched requests wait for their batch: it returns within its
// bound, every client gets an answer or a closed connection (never a hang),
// and an answer computed after the server is gone is dropped safely (run
// under KILN_SANITIZE to check the last part).
TEST(RestStop, StopWhileBatchedRequestsAreInFlight) {
  TempDir dir;
  save_tiny_model(dir.path() + "/m/1", 1.0f);
  ServerCoreOptions o;
  o.config.models = {model_config("m", dir.path() + "/m")};
  o.file_system_poll_wait_seconds = 0;
  o.enable_batching = true;
  o.batching.max_batch_size = 64;
  o.batching.batch_timeout_micros = 400000;  // requests wait 0.4 s for their batch
  o.batching.num_batch_threads = 1;
  for (double drain : {10.0, 0.05}) {  // requests finish; the server gives up before they do
    FrontendOptions f;
    f.num_threads = 2;
    f.drain_seconds = drain;
    Served served(o, f);
    std::atomic<int> ok{0}, dropped{0};
    std::vector<std::thread> clients;
    for (int i = 0; i < 6; ++i)
      clients.emplace_back([&] {
        auto c = served.client();
        c->set_read_timeout(15, 0);
        auto r = c->Post("/v1/models/m:predict", R"({"instances": [[1, 2, 3, 4]]})", "application/json");
        if (r && r->status == 200)
          ++ok;
        else if (!r)
          ++dropped;
      });
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    auto t0 = std::chrono::steady_clock::now();
    served.rest->stop();
    double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(took, drain + 5) << "drain " << drain;
    served.rest.reset();  // the batch may finish after this
    for (auto& t : clients) t.join();
    EXPECT_EQ(ok + dropped, 6) << "drain " << drain;
    if (drain > 1) EXPECT_GT(ok.load(), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // late answers land here
    served.rest = std::make_unique<RestServer>(*served.core, f);  // ~Served stops it
  }
}

TEST(RestJson, DepthScanAndNaN) {
  EXPECT_EQ(json_depth(R"({"a": "[[[[", "b": [[1]]})", 10), 3);
  EXPECT_GT(json_depth(std::string(50, '['), 10), 10);
  Json j = parse_request_json(R"({"s": "NaN Infinity", "v": [NaN, -Infinity]})", 10);
  EXPECT_EQ(j["s"], "NaN Infinity");
  EXPECT_EQ(j["v"][0], "NaN");
  EXPECT_EQ(j["v"][1], "-Infinity");
}

}  // namespace
}  // namespace kiln::serving
