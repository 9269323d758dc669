#include "kiln/serving/tls.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <memory>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/serving/codec/text_proto.h"
#include "tensorflow_serving/config/ssl_config.pb.h"

namespace kiln::serving {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using CertPtr = std::unique_ptr<X509, X509Free>;
using KeyPtr = std::unique_ptr<EVP_PKEY, KeyFree>;

// Never prompt on the terminal for a pass phrase: an encrypted key fails.
int no_password(char*, int, int, void*) { return 0; }

std::vector<CertPtr> read_certs(const std::string& pem) {
  std::vector<CertPtr> out;
  std::unique_ptr<BIO, BioFree> bio(BIO_new_mem_buf(pem.data(), (int)pem.size()));
  if (!bio) return out;
  while (X509* c = PEM_read_bio_X509(bio.get(), nullptr, no_password, nullptr)) out.emplace_back(c);
  ERR_clear_error();  // the loop ends on "no start line"
  return out;
}

KeyPtr read_key(const std::string& pem) {
  std::unique_ptr<BIO, BioFree> bio(BIO_new_mem_buf(pem.data(), (int)pem.size()));
  KeyPtr key(bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, no_password, nullptr) : nullptr);
  ERR_clear_error();
  return key;
}

}  // namespace

void check_tls_options(const TlsOptions& tls, const std::string& source) {
  if (!tls.enabled()) {
    if (!tls.key_pem.empty())
      throw ValueError(source + ": a private key was given without a certificate; give the server certificate too");
    if (tls.client_verify) throw ValueError(source + ": client_verify needs TLS; give a server certificate and key");
    return;
  }
  auto certs = read_certs(tls.cert_pem);
  if (certs.empty())
    throw ValueError(source +
                     ": the server certificate is not a PEM certificate (no '-----BEGIN CERTIFICATE-----' "
                     "block); give the certificate file, e.g. one made by `openssl req -x509`");
  if (tls.key_pem.empty())
    throw ValueError(source + ": the server certificate has no private key; give its key file too");
  KeyPtr key = read_key(tls.key_pem);
  if (!key)
    throw ValueError(source +
                     ": the private key is not an unencrypted PEM private key; give the key file that "
                     "goes with the certificate (decrypt it with `openssl pkey -in KEY -out KEY.plain`)");
  if (X509_check_private_key(certs[0].get(), key.get()) != 1) {
    ERR_clear_error();
    throw ValueError(source +
                     ": the private key does not belong to the server certificate; give the matching "
                     "certificate and key");
  }
  if (tls.client_verify && tls.client_ca_pem.empty())
    throw ValueError(source + ": client_verify needs the CA that signs client certificates; set custom_ca");
  if (!tls.client_ca_pem.empty()) check_client_ca(tls.client_ca_pem, source + ": custom_ca");
}

void check_client_ca(const std::string& ca_pem, const std::string& source) {
  if (read_certs(ca_pem).empty())
    throw ValueError(source +
                     ": not a PEM certificate (no '-----BEGIN CERTIFICATE-----' block); give the CA "
                     "certificate that signs the client certificates");
}

TlsOptions parse_ssl_config(const std::string& text, const std::string& source) {
  tensorflow::serving::SSLConfig c;
  TextProtoOptions options;
  options.allow_multiline_strings = true;
  parse_text_proto(text, source, &c, nullptr, options);
  TlsOptions t;
  t.key_pem = c.server_key();
  t.cert_pem = c.server_cert();
  t.client_ca_pem = c.custom_ca();
  t.client_verify = c.client_verify();
  if (!t.enabled())
    throw ValueError(source + ": server_cert is missing; an SSLConfig needs server_cert and server_key (PEM text)");
  return t;
}

bool configure_ssl_ctx(ssl_ctx_st* ctx, const TlsOptions& tls) {
  if (!ctx) return false;
  auto certs = read_certs(tls.cert_pem);
  KeyPtr key = read_key(tls.key_pem);
  if (certs.empty() || !key) return false;
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_SESSION_RESUMPTION_ON_RENEGOTIATION);
  if (SSL_CTX_use_certificate(ctx, certs[0].get()) != 1) return false;
  for (size_t i = 1; i < certs.size(); ++i)
    if (SSL_CTX_add1_chain_cert(ctx, certs[i].get()) != 1) return false;
  if (SSL_CTX_use_PrivateKey(ctx, key.get()) != 1 || SSL_CTX_check_private_key(ctx) != 1) return false;
  if (tls.client_verify) {
    X509_STORE* store = SSL_CTX_get_cert_store(ctx);
    for (auto& ca : read_certs(tls.client_ca_pem))
      if (X509_STORE_add_cert(store, ca.get()) != 1) return false;
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  ERR_clear_error();
  return true;
}

}  // namespace kiln::serving
