// cpp-httplib as Debian builds libcpp-httplib (OpenSSL, zlib, brotli): the
// same macros must be set wherever httplib.h is included, or the classes
// would not match the compiled library. Include this, never <httplib.h>.
#pragma once

#ifndef CPPHTTPLIB_OPENSSL_SUPPORT
#define CPPHTTPLIB_OPENSSL_SUPPORT
#endif
#ifndef CPPHTTPLIB_ZLIB_SUPPORT
#define CPPHTTPLIB_ZLIB_SUPPORT
#endif
#ifndef CPPHTTPLIB_BROTLI_SUPPORT
#define CPPHTTPLIB_BROTLI_SUPPORT
#endif
#include <httplib.h>
