// The lifecycle of one served model version, as an explicit state machine
// (after TF Serving's loader_harness.h):
//
//   kNew --> kLoading --> kReady --> kQuiescing --> kUnloading --> kDisabled
//               |
//               +--> kError   (load or warmup failed; terminal)
//   kNew --> kDisabled        (dropped before it was ever loaded)
//
// kReady is the only state that serves. kQuiescing: no new requests are
// routed to it, in-flight ones finish. kDisabled and kError are terminal.
// TF Serving's status JSON reports them as START (New), LOADING, AVAILABLE
// (Ready), UNLOADING (Quiescing, Unloading) and END (Disabled, Error; the
// latter with the error in "status").
//
// VersionLifecycle is thread-safe; transition() rejects anything not listed
// above with StateError naming both states.
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>

#include "kiln/core/error.h"

namespace kiln::serving {

enum class VersionState { kNew, kLoading, kReady, kQuiescing, kUnloading, kDisabled, kError };

const char* state_name(VersionState s);      // "New", "Loading", "Ready", ...
const char* tfs_state_name(VersionState s);  // "START", "LOADING", "AVAILABLE", "UNLOADING", "END"
bool is_legal_transition(VersionState from, VersionState to);
bool is_terminal(VersionState s);

class VersionLifecycle {
 public:
  VersionState state() const;
  std::string error() const;  // the load error once in kError, else ""
  // Throws StateError "illegal version transition Ready -> Loading" when not legal.
  void transition(VersionState to);
  // transition(kError) recording the message.
  void fail(const std::string& error);
  // Waits until the state is `s` or terminal, up to `timeout_ms`; returns the state.
  VersionState wait_for(VersionState s, int64_t timeout_ms) const;

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  VersionState state_ = VersionState::kNew;  // guarded by mu_
  std::string error_;                        // guarded by mu_
};

}  // namespace kiln::serving
