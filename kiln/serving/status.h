// Protocol-independent errors of the server, mapped to gRPC codes in one
// place and from there to HTTP with TF Serving's table (one function both
// the REST and the gRPC front ends use).
//
// Inside kiln::serving, code throws ServingError(Code, message) where the
// code matters (NOT_FOUND for an unknown model, RESOURCE_EXHAUSTED for a
// full batch queue, ...). At a front end's edge, status_of(exception) turns
// anything thrown (ServingError, kiln's hierarchy, LibTorch's c10::Error,
// std::bad_alloc) into a Status:
//   try { ... } catch (...) { Status s = status_of_current_exception(); }
#pragma once

#include <exception>
#include <string>

#include "kiln/core/error.h"

namespace kiln::serving {

// gRPC status codes with their wire values.
enum class Code : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};

// "OK", "INVALID_ARGUMENT", ... as gRPC and TF Serving's status JSON spell them.
const char* code_name(Code code);

// TF Serving's gRPC-status-to-HTTP mapping (http_rest_api_util): OK 200,
// CANCELLED 499, INVALID_ARGUMENT/FAILED_PRECONDITION/OUT_OF_RANGE 400,
// DEADLINE_EXCEEDED 504, NOT_FOUND 404, ALREADY_EXISTS/ABORTED 409,
// PERMISSION_DENIED 403, RESOURCE_EXHAUSTED 429, UNIMPLEMENTED 501,
// UNAVAILABLE 503, UNAUTHENTICATED 401, UNKNOWN/INTERNAL/DATA_LOSS 500.
int http_status(Code code);

struct Status {
  Code code = Code::kOk;
  std::string message;
  bool ok() const { return code == Code::kOk; }
  static Status Ok() { return {}; }
};

// An error with its code. Derives from kiln::Error so library code that
// catches kiln::Error still sees it.
class ServingError : public kiln::Error {
 public:
  ServingError(Code code, const std::string& message) : kiln::Error(message), code_(code) {}
  Code code() const { return code_; }
  Status status() const { return {code_, what()}; }

 private:
  Code code_;
};

// ServingError -> its code; ValueError/ShapeError/FormatError/UserError ->
// INVALID_ARGUMENT; NotFoundError -> NOT_FOUND; StateError ->
// FAILED_PRECONDITION; IOError -> UNAVAILABLE; c10::Error -> INVALID_ARGUMENT
// (LibTorch reports shape/dtype mismatches that way); std::bad_alloc ->
// RESOURCE_EXHAUSTED; anything else -> INTERNAL.
Status status_of(const std::exception& e);
// For use inside catch (...): rethrows and classifies the current exception.
Status status_of_current_exception();

}  // namespace kiln::serving
