// TLS material for the front ends (TlsOptions, frontend.h):
//  * check_tls_options: parses the PEM certificate, key and CA and checks that
//    the key belongs to the certificate, so a bad file is one clear error at
//    start-up instead of every handshake failing later;
//  * check_client_ca: the CA that signs client certificates (mutual TLS), on
//    its own, for kiln serve --ssl_client_ca;
//  * parse_ssl_config: TF Serving's --ssl_config_file (an SSLConfig message in
//    protobuf text format, PEM contents inline);
//  * configure_ssl_ctx: the OpenSSL server context the REST front end uses.
//
//   TlsOptions t{read_file("server.crt"), read_file("server.key")};
//   check_tls_options(t, "--ssl_cert/--ssl_key");  // ValueError on a bad file
//
// Thread-safe (no shared state). OpenSSL stays out of this header.
#pragma once

#include <string>

#include "kiln/serving/frontend.h"

struct ssl_ctx_st;  // OpenSSL's SSL_CTX

namespace kiln::serving {

// ValueError "<source>: <what is wrong>; <what to do>" when the certificate
// is not PEM, the key is missing, encrypted, not PEM or not the
// certificate's, or client_verify is set without a CA. No-op when
// !tls.enabled() and no key or CA was given.
void check_tls_options(const TlsOptions& tls, const std::string& source);

// ValueError "<source>: not a PEM certificate; ..." unless `ca_pem` holds at
// least one PEM certificate. check_tls_options calls it for client_ca_pem.
void check_client_ca(const std::string& ca_pem, const std::string& source);

// SSLConfig { server_key, server_cert, custom_ca, client_verify } in text
// format (field names as TF Serving's ssl_config.proto; strings hold the PEM
// text, with \n escapes or raw line breaks), read by libprotobuf's TextFormat
// into tensorflow.serving.SSLConfig. ValueError "<source>: line L, column C:
// ..." on unknown fields or bad syntax. The result is not checked yet: call check_tls_options.
TlsOptions parse_ssl_config(const std::string& text, const std::string& source);

// Loads a checked TlsOptions into `ctx` (TLS 1.2 or newer, the certificate
// chain, the key; with client_verify, clients must present a certificate
// signed by client_ca_pem). False if OpenSSL refuses any part.
bool configure_ssl_ctx(ssl_ctx_st* ctx, const TlsOptions& tls);

}  // namespace kiln::serving
