// Helpers for the serving tests: tiny models saved into version directories,
// a core + REST server on loopback, and a JSON client.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>

#include "kiln/core/io.h"
#include "kiln/core/json.h"
#include "kiln/layers/dense.h"
#include "kiln/models/sequential.h"
#include "kiln/saving/model_io.h"
#include "kiln/serving/core/server_core.h"
#include "kiln/serving/rest/httplib.h"
#include "kiln/serving/rest/rest_server.h"
#include "kiln/testing/testing.h"

namespace kiln::serving::testing {

// Sequential(Input(4) -> Dense(3)) with every weight = `fill`, saved at dir.
inline ModelPtr save_tiny_model(const std::string& dir, float fill) {
  auto m = models::Sequential();
  m->add(layers::Input({4}));
  m->add(layers::Dense(3));
  for (auto& w : m->weights()) w->value().data().fill_(fill);
  m->save(dir);
  return m;
}

// Expected output of save_tiny_model(fill) for one row x: fill*sum(x)+fill per unit.
inline float tiny_output(float fill, const std::vector<float>& x) {
  float s = 0;
  for (float v : x) s += v;
  return fill * s + fill;
}

inline std::string input_name(const ServableHandle& h) {
  return h.signatures()["serving_default"]["inputs"].begin().key();
}

// HTTPS client to 127.0.0.1:port trusting `ca_path` (the server's
// self-signed certificate), presenting a client certificate when given
// (mutual TLS); connect and read time out after `timeout_s`.
inline std::unique_ptr<httplib::SSLClient> https_client(int port, const std::string& ca_path,
                                                        const std::string& client_cert_path = "",
                                                        const std::string& client_key_path = "", int timeout_s = 30) {
  auto c = client_cert_path.empty()
               ? std::make_unique<httplib::SSLClient>("127.0.0.1", port)
               : std::make_unique<httplib::SSLClient>("127.0.0.1", port, client_cert_path, client_key_path);
  c->set_ca_cert_path(ca_path.c_str());
  c->enable_server_certificate_verification(true);
  c->set_connection_timeout(timeout_s, 0);
  c->set_read_timeout(timeout_s, 0);
  return c;
}

struct Served {
  std::unique_ptr<ServerCore> core;
  std::unique_ptr<RestServer> rest;
  int port = 0;
  explicit Served(ServerCoreOptions o, FrontendOptions f = {}) {
    core = std::make_unique<ServerCore>(std::move(o));
    core->start();
    rest = std::make_unique<RestServer>(*core, f);
    port = rest->start();
  }
  ~Served() {
    rest->stop();
    core.reset();
  }
  // HTTPS client trusting `ca_path` (the server's self-signed certificate).
  std::unique_ptr<httplib::SSLClient> tls_client(const std::string& ca_path) const {
    return https_client(port, ca_path);
  }
  std::unique_ptr<httplib::Client> client() const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port);
    c->set_read_timeout(30, 0);
    return c;
  }
};

// A self-signed certificate for localhost / 127.0.0.1 (P-256 key, one day),
// made at test time with the `openssl` command: <dir>/<stem>.crt and .key.
struct TestCert {
  std::string cert_path, key_path, cert_pem, key_pem;
};
inline bool have_openssl() { return run_command("command -v openssl >/dev/null 2>&1").exit_code == 0; }
#define KILN_SKIP_WITHOUT_OPENSSL()                                                                   \
  if (!::kiln::serving::testing::have_openssl())                                                      \
  GTEST_SKIP() << "the openssl command is missing (apt-get install openssl); TLS tests would make a " \
                  "self-signed certificate with it and query HTTPS and gRPC over TLS"
inline TestCert make_test_cert(const std::string& dir, const std::string& stem) {
  TestCert c{dir + "/" + stem + ".crt", dir + "/" + stem + ".key", "", ""};
  auto r = run_command(
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 "
      "-subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout '" +
      c.key_path + "' -out '" + c.cert_path + "' 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  c.cert_pem = read_file(c.cert_path);
  c.key_pem = read_file(c.key_path);
  return c;
}
// For mutual TLS: a CA (self-signed, CA:TRUE, may sign certificates) and a
// client certificate it signs (clientAuth), at <dir>/<stem>.crt and .key.
inline TestCert make_test_ca(const std::string& dir, const std::string& stem) {
  TestCert c{dir + "/" + stem + ".crt", dir + "/" + stem + ".key", "", ""};
  auto r = run_command(
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 "
      "-subj '/CN=kiln test CA " +
      stem +
      "' -addext basicConstraints=critical,CA:TRUE "
      "-addext keyUsage=critical,keyCertSign,cRLSign -keyout '" +
      c.key_path + "' -out '" + c.cert_path + "' 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  c.cert_pem = read_file(c.cert_path);
  c.key_pem = read_file(c.key_path);
  return c;
}
inline TestCert make_client_cert(const std::string& dir, const std::string& stem, const TestCert& ca) {
  TestCert c{dir + "/" + stem + ".crt", dir + "/" + stem + ".key", "", ""};
  const std::string csr = dir + "/" + stem + ".csr", ext = dir + "/" + stem + ".ext";
  atomic_write_file(ext,
                    "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n");
  auto r = run_command("openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=" + stem +
                       " -keyout '" + c.key_path + "' -out '" + csr + "' 2>&1 && openssl x509 -req -in '" + csr +
                       "' -CA '" + ca.cert_path + "' -CAkey '" + ca.key_path + "' -CAcreateserial -days 1 -extfile '" +
                       ext + "' -out '" + c.cert_path + "' 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  c.cert_pem = read_file(c.cert_path);
  c.key_pem = read_file(c.key_path);
  return c;
}
inline TlsOptions tls_of(const TestCert& c) {
  TlsOptions t;
  t.cert_pem = c.cert_pem;
  t.key_pem = c.key_pem;
  return t;
}

inline ModelConfig model_config(const std::string& name, const std::string& base) {
  ModelConfig m;
  m.name = name;
  m.base_path = base;
  return m;
}

}  // namespace kiln::serving::testing
