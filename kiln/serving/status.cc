#include "kiln/serving/status.h"

#include <c10/util/Exception.h>

#include <new>

#include "kiln/core/device.h"

namespace kiln::serving {

const char* code_name(Code code) {
  switch (code) {
    case Code::kOk:
      return "OK";
    case Code::kCancelled:
      return "CANCELLED";
    case Code::kUnknown:
      return "UNKNOWN";
    case Code::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case Code::kDeadlineExceeded:
      return "DEADLINE_EXCEEDED";
    case Code::kNotFound:
      return "NOT_FOUND";
    case Code::kAlreadyExists:
      return "ALREADY_EXISTS";
    case Code::kPermissionDenied:
      return "PERMISSION_DENIED";
    case Code::kResourceExhausted:
      return "RESOURCE_EXHAUSTED";
    case Code::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case Code::kAborted:
      return "ABORTED";
    case Code::kOutOfRange:
      return "OUT_OF_RANGE";
    case Code::kUnimplemented:
      return "UNIMPLEMENTED";
    case Code::kInternal:
      return "INTERNAL";
    case Code::kUnavailable:
      return "UNAVAILABLE";
    case Code::kDataLoss:
      return "DATA_LOSS";
    case Code::kUnauthenticated:
      return "UNAUTHENTICATED";
  }
  return "UNKNOWN";
}

int http_status(Code code) {
  switch (code) {
    case Code::kOk:
      return 200;
    case Code::kCancelled:
      return 499;
    case Code::kInvalidArgument:
    case Code::kFailedPrecondition:
    case Code::kOutOfRange:
      return 400;
    case Code::kDeadlineExceeded:
      return 504;
    case Code::kNotFound:
      return 404;
    case Code::kAlreadyExists:
    case Code::kAborted:
      return 409;
    case Code::kPermissionDenied:
      return 403;
    case Code::kResourceExhausted:
      return 429;
    case Code::kUnimplemented:
      return 501;
    case Code::kUnavailable:
      return 503;
    case Code::kUnauthenticated:
      return 401;
    case Code::kUnknown:
    case Code::kInternal:
    case Code::kDataLoss:
      return 500;
  }
  return 500;
}

Status status_of(const std::exception& e) {
  if (auto* s = dynamic_cast<const ServingError*>(&e)) return s->status();
  if (dynamic_cast<const NotFoundError*>(&e)) return {Code::kNotFound, e.what()};
  // A request too large for the device's memory fails alone (TF Serving's
  // RESOURCE_EXHAUSTED: HTTP 429, gRPC 8); the model keeps serving.
  if (dynamic_cast<const ResourceExhaustedError*>(&e)) return {Code::kResourceExhausted, e.what()};
  if (is_out_of_memory(e)) {
    const auto* c = dynamic_cast<const c10::Error*>(&e);
    std::string m = c ? c->what_without_backtrace() : e.what();
    if (auto nl = m.find('\n'); nl != std::string::npos) m.resize(nl);
    return {Code::kResourceExhausted, "out of memory: " + m + "; send fewer or smaller instances"};
  }
  if (dynamic_cast<const UserError*>(&e)) return {Code::kInvalidArgument, e.what()};
  if (dynamic_cast<const StateError*>(&e)) return {Code::kFailedPrecondition, e.what()};
  if (dynamic_cast<const IOError*>(&e)) return {Code::kUnavailable, e.what()};
  if (auto* c = dynamic_cast<const c10::Error*>(&e)) return {Code::kInvalidArgument, c->what_without_backtrace()};
  if (dynamic_cast<const std::bad_alloc*>(&e)) return {Code::kResourceExhausted, "out of memory"};
  return {Code::kInternal, e.what()};
}

Status status_of_current_exception() {
  try {
    throw;
  } catch (const std::exception& e) {
    return status_of(e);
  } catch (...) {
    return {Code::kUnknown, "unknown exception"};
  }
}

}  // namespace kiln::serving
