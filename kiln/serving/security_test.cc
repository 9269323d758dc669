// Bearer-token auth and TLS on both front ends, with real clients on
// loopback: httplib (HTTP and HTTPS) and grpc::Channel (plaintext and TLS).
// Certificates are made at test time with the openssl command (skipped
// with a message when it is missing).
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "inference/grpc_predict_v2.grpc.pb.h"
#include "kiln/serving/codec/tensor_proto.h"
#include "kiln/serving/grpc/grpc_server.h"
#include "kiln/serving/serving_test_util.h"
#include "kiln/serving/tls.h"
#include "tensorflow_serving/apis/model_service.grpc.pb.h"
#include "tensorflow_serving/apis/prediction_service.grpc.pb.h"

namespace kiln::serving {
namespace {

using namespace kiln::serving::testing;
namespace tfs = tensorflow::serving;

const char* kBody = R"({"instances": [[1, 2, 3, 4]]})";

ServerCoreOptions tiny_core(const TempDir& dir) {
  save_tiny_model(dir.path() + "/m/1", 0.5f);
  ServerCoreOptions o;
  o.config.models = {model_config("m", dir.path() + "/m")};
  o.file_system_poll_wait_seconds = 0;
  return o;
}

// A core and a gRPC server over it.
struct GrpcServed {
  std::unique_ptr<ServerCore> core;
  std::unique_ptr<GrpcServer> server;
  int port = 0;
  GrpcServed(ServerCoreOptions o, FrontendOptions f) {
    core = std::make_unique<ServerCore>(std::move(o));
    core->start();
    server = std::make_unique<GrpcServer>(*core, f);
    port = server->start();
  }
  ~GrpcServed() {
    server->stop();
    core->stop();
  }
  std::string target() const { return "127.0.0.1:" + std::to_string(port); }
};

// Predict [[1, 2, 3, 4]]: the status and, when OK, the first output value.
grpc::Status predict(const std::shared_ptr<grpc::Channel>& ch, ServerCore& core, const std::string& auth,
                     float* first = nullptr) {
  tfs::PredictRequest req;
  req.mutable_model_spec()->set_name("m");
  to_tensor_proto(at::tensor({1.f, 2.f, 3.f, 4.f}).reshape({1, 4}),
                  &(*req.mutable_inputs())[input_name(*core.get({"m"}))]);
  tfs::PredictResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  if (!auth.empty()) ctx.AddMetadata("authorization", auth);
  auto s = tfs::PredictionService::NewStub(ch)->Predict(&ctx, req, &resp);
  if (s.ok() && first) *first = from_tensor_proto(resp.outputs().begin()->second, "out").tensor[0][0].item<float>();
  return s;
}

// --- bearer tokens -------------------------------------------------------------

TEST(BearerToken, MatchesOnlyTheExactTokenWithTheBearerScheme) {
  EXPECT_TRUE(bearer_token_matches("Bearer s3cret", "s3cret"));
  EXPECT_TRUE(bearer_token_matches("bearer s3cret", "s3cret"));  // the scheme is case-insensitive
  EXPECT_FALSE(bearer_token_matches("Bearer s3cres", "s3cret"));
  EXPECT_FALSE(bearer_token_matches("Bearer s3cret2", "s3cret"));
  EXPECT_FALSE(bearer_token_matches("Bearer s3cre", "s3cret"));
  EXPECT_FALSE(bearer_token_matches("Bearer S3CRET", "s3cret"));  // the token is not
  EXPECT_FALSE(bearer_token_matches("Basic s3cret", "s3cret"));
  EXPECT_FALSE(bearer_token_matches("s3cret", "s3cret"));
  EXPECT_FALSE(bearer_token_matches("", "s3cret"));
  EXPECT_FALSE(bearer_token_matches("Bearer ", ""));  // an empty token never matches
}

// Enabled admin routes need the admin token, and only it: the ordinary bearer
// token does not unload a model.
TEST(RestAuth, AdminRoutesNeedTheAdminToken) {
  TempDir dir;
  FrontendOptions f;
  f.bearer_token = "s3cret";
  f.enable_admin = true;
  f.admin_token = "adm1n";
  Served s(tiny_core(dir), f);
  auto c = s.client();
  for (const char* auth : {"", "Bearer s3cret", "Bearer adm1m"}) {
    httplib::Headers h;
    if (*auth) h.emplace("Authorization", auth);
    auto r = c->Post("/v1/models/m:unload", h, "", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401) << auth;
    EXPECT_TRUE(s.core->is_ready({"m"})) << auth;
  }
  auto r = c->Post("/v1/models/m:unload", {{"Authorization", "Bearer adm1n"}}, "", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_TRUE(s.core->wait_until_idle(10));
  EXPECT_FALSE(s.core->is_ready({"m"}));
  // Enabled without any token is refused at start.
  FrontendOptions bad;
  bad.enable_admin = true;
  EXPECT_THROW(bad.validate(), ValueError);
}

TEST(RestAuth, PredictNeedsTheTokenHealthChecksDoNot) {
  TempDir dir;
  FrontendOptions f;
  f.bearer_token = "s3cret";
  Served s(tiny_core(dir), f);
  auto c = s.client();

  auto r = c->Post("/v1/models/m:predict", kBody, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(r->get_header_value("WWW-Authenticate"), "Bearer");
  EXPECT_NE(Json::parse(r->body)["error"].get<std::string>().find("missing bearer token"), std::string::npos)
      << r->body;

  r = c->Post("/v1/models/m:predict", {{"Authorization", "Bearer wrong"}}, kBody, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  EXPECT_NE(Json::parse(r->body)["error"].get<std::string>().find("wrong bearer token"), std::string::npos) << r->body;

  r = c->Post("/v1/models/m:predict", {{"Authorization", "Bearer s3cret"}}, kBody, "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_FLOAT_EQ(Json::parse(r->body)["predictions"][0][0].get<float>(), tiny_output(0.5f, {1, 2, 3, 4}));

  // Every other route is guarded too: status, metadata, KServe, metrics, admin.
  for (const char* path : {"/v1/models/m", "/v1/models/m/metadata", "/v2/models/m", "/v2/models/m/ready", "/metrics",
                           "/monitoring/prometheus/metrics"}) {
    auto g = c->Get(path);
    ASSERT_TRUE(g) << path;
    EXPECT_EQ(g->status, 401) << path;
    g = c->Get(path, {{"Authorization", "Bearer s3cret"}});
    ASSERT_TRUE(g) << path;
    EXPECT_EQ(g->status, 200) << path << ": " << g->body;
  }
  // Admin routes are off unless enabled: 403 naming the flag, even with the token.
  r = c->Post("/v1/models/m:unload", {{"Authorization", "Bearer s3cret"}}, "", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 403);
  EXPECT_NE(r->body.find("--enable_admin_routes"), std::string::npos) << r->body;
  EXPECT_TRUE(s.core->is_ready({"m"})) << "an unload while admin routes are off must not unload";

  // Health checks answer without a token (Kubernetes probes send none).
  for (const char* path : {"/v2/health/live", "/v2/health/ready"}) {
    auto g = c->Get(path);
    ASSERT_TRUE(g) << path;
    EXPECT_EQ(g->status, 200) << path << ": " << g->body;
  }
}

TEST(GrpcAuth, CallsNeedTheTokenHealthChecksDoNot) {
  TempDir dir;
  FrontendOptions f;
  f.bearer_token = "s3cret";
  GrpcServed s(tiny_core(dir), f);
  auto ch = grpc::CreateChannel(s.target(), grpc::InsecureChannelCredentials());

  auto st = predict(ch, *s.core, "");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(st.error_message().find("missing bearer token"), std::string::npos) << st.error_message();
  st = predict(ch, *s.core, "Bearer wrong");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(st.error_message().find("wrong bearer token"), std::string::npos) << st.error_message();
  float y = 0;
  st = predict(ch, *s.core, "Bearer s3cret", &y);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_FLOAT_EQ(y, tiny_output(0.5f, {1, 2, 3, 4}));

  // ModelService and KServe's model calls are guarded too.
  {
    tfs::GetModelStatusRequest req;
    req.mutable_model_spec()->set_name("m");
    tfs::GetModelStatusResponse resp;
    grpc::ClientContext ctx;
    EXPECT_EQ(tfs::ModelService::NewStub(ch)->GetModelStatus(&ctx, req, &resp).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  auto kserve = inference::GRPCInferenceService::NewStub(ch);
  {
    inference::ModelReadyRequest req;
    req.set_name("m");
    inference::ModelReadyResponse resp;
    grpc::ClientContext ctx;
    EXPECT_EQ(kserve->ModelReady(&ctx, req, &resp).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  // ServerLive / ServerReady are the health checks: open.
  {
    inference::ServerLiveResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(kserve->ServerLive(&ctx, {}, &resp).ok());
    EXPECT_TRUE(resp.live());
  }
  {
    inference::ServerReadyResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(kserve->ServerReady(&ctx, {}, &resp).ok());
    EXPECT_TRUE(resp.ready());
  }
}

// --- TLS material ----------------------------------------------------------------

TEST(TlsOptions, BadCertificatesAndKeysAreOneClearError) {
  KILN_SKIP_WITHOUT_OPENSSL();
  TempDir dir;
  auto a = make_test_cert(dir.path(), "a");
  auto b = make_test_cert(dir.path(), "b");
  EXPECT_NO_THROW(check_tls_options(tls_of(a), "src"));
  EXPECT_NO_THROW(check_tls_options(TlsOptions{}, "src"));  // plaintext

  auto expect_error = [](TlsOptions t, const std::string& part) {
    try {
      check_tls_options(t, "--ssl_cert x");
      ADD_FAILURE() << "no error; expected one containing: " << part;
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).rfind("--ssl_cert x: ", 0), 0u) << e.what();
    }
  };
  TlsOptions t = tls_of(a);
  t.key_pem = b.key_pem;
  expect_error(t, "does not belong to the server certificate");
  t = tls_of(a);
  t.cert_pem = "hello";
  expect_error(t, "not a PEM certificate");
  t = tls_of(a);
  t.cert_pem = a.key_pem;  // files swapped
  expect_error(t, "not a PEM certificate");
  t = tls_of(a);
  t.key_pem = a.cert_pem;
  expect_error(t, "not an unencrypted PEM private key");
  t = tls_of(a);
  t.key_pem.clear();
  expect_error(t, "has no private key");
  t = tls_of(a);
  t.client_verify = true;
  expect_error(t, "client_verify needs the CA");
  t.client_ca_pem = a.key_pem;  // a key where the CA certificate belongs
  expect_error(t, "custom_ca: not a PEM certificate");
  t = TlsOptions{};
  t.key_pem = a.key_pem;
  expect_error(t, "without a certificate");
  // An encrypted key fails without prompting on the terminal.
  auto r = run_command("openssl pkey -in '" + a.key_path + "' -aes256 -passout pass:pw -out '" + dir.path() +
                       "/enc.key' 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  t = tls_of(a);
  t.key_pem = read_file(dir.path() + "/enc.key");
  expect_error(t, "not an unencrypted PEM private key");

  // The front ends refuse them at construction.
  ServerCore core(ServerCoreOptions{});
  FrontendOptions f;
  f.tls = tls_of(a);
  f.tls.key_pem = b.key_pem;
  EXPECT_THROW({ RestServer rest(core, f); }, ValueError);
  EXPECT_THROW({ GrpcServer grpc(core, f); }, ValueError);
}

TEST(TlsOptions, SslConfigTextFormatAsTfServingWritesIt) {
  // PEM text with \n escapes or pasted over several lines, as TF Serving's
  // ssl_config_file holds it.
  TlsOptions t = parse_ssl_config(
      "server_key: '-----BEGIN PRIVATE KEY-----\nAAA\n-----END PRIVATE KEY-----'\n"
      "server_cert: \"-----BEGIN CERTIFICATE-----\\nBBB\\n-----END CERTIFICATE-----\"\n"
      "custom_ca: \"CA\"\nclient_verify: true\n",
      "ssl.config");
  EXPECT_EQ(t.key_pem, "-----BEGIN PRIVATE KEY-----\nAAA\n-----END PRIVATE KEY-----");
  EXPECT_EQ(t.cert_pem, "-----BEGIN CERTIFICATE-----\nBBB\n-----END CERTIFICATE-----");
  EXPECT_EQ(t.client_ca_pem, "CA");
  EXPECT_TRUE(t.client_verify);
  try {
    parse_ssl_config("server_cert: 'x'\nserver_crt: 'y'\n", "ssl.config");
    ADD_FAILURE() << "an unknown field was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("line 2, column 1: unknown field `server_crt` in SSLConfig"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(parse_ssl_config("server_key: 'k'\n", "ssl.config"), ValueError);  // no certificate
  EXPECT_THROW(parse_ssl_config("client_verify: maybe\n", "ssl.config"), ValueError);
}

// --- HTTPS -------------------------------------------------------------------------

TEST(RestTls, ServesHttpsAndSurvivesPlainHttp) {
  KILN_SKIP_WITHOUT_OPENSSL();
  TempDir dir;
  auto cert = make_test_cert(dir.path(), "server");
  FrontendOptions f;
  f.tls = tls_of(cert);
  Served s(tiny_core(dir), f);

  auto https = s.tls_client(cert.cert_path);
  auto r = https->Post("/v1/models/m:predict", kBody, "application/json");
  ASSERT_TRUE(r) << httplib::to_string(r.error()) << " verify=" << https->get_openssl_verify_result();
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_FLOAT_EQ(Json::parse(r->body)["predictions"][0][0].get<float>(), tiny_output(0.5f, {1, 2, 3, 4}));
  https->stop();

  // Plain HTTP to the HTTPS port: the handshake fails, the request gets no answer.
  auto plain = s.client();
  plain->set_read_timeout(5, 0);
  auto p = plain->Post("/v1/models/m:predict", kBody, "application/json");
  EXPECT_FALSE(p && p->status == 200) << "plain HTTP was served over the TLS port";
  plain->stop();

  // A client that does not trust the certificate refuses the server.
  httplib::SSLClient untrusting("127.0.0.1", s.port);
  untrusting.set_ca_cert_path((dir.path() + "/nonexistent.pem").c_str());
  untrusting.enable_server_certificate_verification(true);
  EXPECT_FALSE(untrusting.Get("/v2/health/live"));

  // ...and the server keeps serving.
  auto again = s.tls_client(cert.cert_path);
  auto g = again->Get("/v2/health/live");
  ASSERT_TRUE(g) << httplib::to_string(g.error());
  EXPECT_EQ(g->status, 200);
  r = again->Post("/v1/models/m:predict", kBody, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  again->stop();
}

// HTTPS client trusting the server's certificate and presenting `client` (if any).
std::unique_ptr<httplib::SSLClient> mtls_client(int port, const TestCert& server, const TestCert* client) {
  return https_client(port, server.cert_path, client ? client->cert_path : "", client ? client->key_path : "", 5);
}

TEST(RestTls, ClientVerifyRequiresACertificateSignedByTheClientCa) {
  KILN_SKIP_WITHOUT_OPENSSL();
  TempDir dir;
  auto server = make_test_cert(dir.path(), "server");
  auto ca = make_test_ca(dir.path(), "ca");
  auto client = make_client_cert(dir.path(), "client", ca);
  auto other_ca = make_test_ca(dir.path(), "other_ca");
  auto stranger = make_client_cert(dir.path(), "stranger", other_ca);
  FrontendOptions f;
  f.tls = tls_of(server);
  f.tls.client_ca_pem = ca.cert_pem;
  f.tls.client_verify = true;
  Served s(tiny_core(dir), f);

  auto good = mtls_client(s.port, server, &client);
  auto r = good->Post("/v1/models/m:predict", kBody, "application/json");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_FLOAT_EQ(Json::parse(r->body)["predictions"][0][0].get<float>(), tiny_output(0.5f, {1, 2, 3, 4}));
  good->stop();

  // No certificate, or one from another CA: refused in the handshake, so no
  // route answers, not even the health check (which a bearer token leaves open).
  for (const TestCert* who : std::vector<const TestCert*>{nullptr, &stranger}) {
    const char* name = who ? "a certificate from another CA" : "no certificate";
    auto c = mtls_client(s.port, server, who);
    auto g = c->Get("/v2/health/live");
    EXPECT_FALSE(g) << name << ": HTTP " << g->status;
    auto p = c->Post("/v1/models/m:predict", kBody, "application/json");
    EXPECT_FALSE(p) << name << ": HTTP " << p->status;
    c->stop();
  }
  // ...and the server keeps serving the client it trusts.
  auto again = mtls_client(s.port, server, &client);
  auto g = again->Get("/v2/health/live");
  ASSERT_TRUE(g) << httplib::to_string(g.error());
  EXPECT_EQ(g->status, 200);
  again->stop();
}

// --- gRPC over TLS ---------------------------------------------------------------

std::shared_ptr<grpc::Channel> tls_channel(const std::string& target, const std::string& ca_pem,
                                           const TestCert* client = nullptr) {
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = ca_pem;
  if (client) {
    o.pem_private_key = client->key_pem;
    o.pem_cert_chain = client->cert_pem;
  }
  return grpc::CreateChannel(target, grpc::SslCredentials(o));
}

TEST(GrpcTls, ServesTlsAndSurvivesPlaintextClients) {
  KILN_SKIP_WITHOUT_OPENSSL();
  TempDir dir;
  auto cert = make_test_cert(dir.path(), "server");
  FrontendOptions f;
  f.tls = tls_of(cert);
  f.bearer_token = "s3cret";  // TLS and tokens together, as one would deploy them
  GrpcServed s(tiny_core(dir), f);

  float y = 0;
  auto st = predict(tls_channel(s.target(), cert.cert_pem), *s.core, "Bearer s3cret", &y);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_FLOAT_EQ(y, tiny_output(0.5f, {1, 2, 3, 4}));
  EXPECT_EQ(predict(tls_channel(s.target(), cert.cert_pem), *s.core, "").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  // A plaintext client cannot talk to the TLS port...
  st = predict(grpc::CreateChannel(s.target(), grpc::InsecureChannelCredentials()), *s.core, "Bearer s3cret");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  // ...nor one that does not trust the certificate (another CA)...
  auto other = make_test_cert(dir.path(), "other");
  EXPECT_EQ(predict(tls_channel(s.target(), other.cert_pem), *s.core, "Bearer s3cret").error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // ...and the server keeps serving.
  st = predict(tls_channel(s.target(), cert.cert_pem), *s.core, "Bearer s3cret", &y);
  ASSERT_TRUE(st.ok()) << st.error_message();
}

TEST(GrpcTls, ClientVerifyRequiresACertificateSignedByTheCustomCa) {
  KILN_SKIP_WITHOUT_OPENSSL();
  TempDir dir;
  auto server = make_test_cert(dir.path(), "server");
  auto client = make_test_cert(dir.path(), "client");  // self-signed: its own CA
  auto stranger = make_test_cert(dir.path(), "stranger");
  FrontendOptions f;
  f.tls = tls_of(server);
  f.tls.client_ca_pem = client.cert_pem;
  f.tls.client_verify = true;
  GrpcServed s(tiny_core(dir), f);

  auto st = predict(tls_channel(s.target(), server.cert_pem, &client), *s.core, "");
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(predict(tls_channel(s.target(), server.cert_pem), *s.core, "").error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(predict(tls_channel(s.target(), server.cert_pem, &stranger), *s.core, "").error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace kiln::serving
