// kiln's one error model for the library: exceptions from one small
// hierarchy. The CLI maps UserError subclasses to a one-line message and exit
// code 2; the server (later) maps them to gRPC status / HTTP codes.
//
// Messages name the received value and the fix, Keras-style:
//   "Dense: received an invalid value for `units`, expected a positive
//    integer. Received: units=0"
#pragma once

#include <stdexcept>
#include <string>

namespace kiln {

// Base of every error kiln throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Errors caused by the caller's input: bad arguments, configs, files. The CLI
// prints these as one line and exits 2.
class UserError : public Error {
 public:
  using Error::Error;
};

class ValueError : public UserError {  // an argument or config value is invalid
 public:
  using UserError::UserError;
};
class ShapeError : public UserError {  // tensor shapes do not fit together
 public:
  using UserError::UserError;
};
class NotFoundError : public UserError {  // a file, layer, key or name is missing
 public:
  using UserError::UserError;
};
class FormatError : public UserError {  // a file is corrupt, truncated or not ours
 public:
  using UserError::UserError;
};
// The device (a GPU, or the host) cannot hold what the sizes asked for: a
// batch too large for the GPU's memory. The message names the sizes and a
// smaller choice; the server answers it with RESOURCE_EXHAUSTED.
class ResourceExhaustedError : public UserError {
 public:
  using UserError::UserError;
};

// An illegal transition of an explicit lifecycle or use before set-up
// (e.g. fit() before compile()).
class StateError : public Error {
 public:
  using Error::Error;
};

// I/O failed for reasons outside the caller's control (disk full, EIO).
class IOError : public Error {
 public:
  using Error::Error;
};

}  // namespace kiln
