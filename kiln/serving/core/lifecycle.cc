#include "kiln/serving/core/lifecycle.h"

#include <chrono>

namespace kiln::serving {

const char* state_name(VersionState s) {
  switch (s) {
    case VersionState::kNew:
      return "New";
    case VersionState::kLoading:
      return "Loading";
    case VersionState::kReady:
      return "Ready";
    case VersionState::kQuiescing:
      return "Quiescing";
    case VersionState::kUnloading:
      return "Unloading";
    case VersionState::kDisabled:
      return "Disabled";
    case VersionState::kError:
      return "Error";
  }
  return "?";
}

const char* tfs_state_name(VersionState s) {
  switch (s) {
    case VersionState::kNew:
      return "START";
    case VersionState::kLoading:
      return "LOADING";
    case VersionState::kReady:
      return "AVAILABLE";
    case VersionState::kQuiescing:
    case VersionState::kUnloading:
      return "UNLOADING";
    case VersionState::kDisabled:
    case VersionState::kError:
      return "END";
  }
  return "UNKNOWN";
}

bool is_legal_transition(VersionState from, VersionState to) {
  using S = VersionState;
  switch (from) {
    case S::kNew:
      return to == S::kLoading || to == S::kDisabled;
    case S::kLoading:
      return to == S::kReady || to == S::kError;
    case S::kReady:
      return to == S::kQuiescing;
    case S::kQuiescing:
      return to == S::kUnloading;
    case S::kUnloading:
      return to == S::kDisabled;
    case S::kDisabled:
    case S::kError:
      return false;
  }
  return false;
}

bool is_terminal(VersionState s) { return s == VersionState::kDisabled || s == VersionState::kError; }

VersionState VersionLifecycle::state() const {
  std::lock_guard<std::mutex> l(mu_);
  return state_;
}

std::string VersionLifecycle::error() const {
  std::lock_guard<std::mutex> l(mu_);
  return error_;
}

void VersionLifecycle::transition(VersionState to) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!is_legal_transition(state_, to))
      throw StateError(std::string("illegal version transition ") + state_name(state_) + " -> " + state_name(to) +
                       "; legal: New->Loading->Ready->Quiescing->Unloading->Disabled, Loading->Error, New->Disabled");
    state_ = to;
  }
  cv_.notify_all();
}

void VersionLifecycle::fail(const std::string& error) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!is_legal_transition(state_, VersionState::kError))
      throw StateError(std::string("illegal version transition ") + state_name(state_) + " -> Error");
    state_ = VersionState::kError;
    error_ = error;
  }
  cv_.notify_all();
}

VersionState VersionLifecycle::wait_for(VersionState s, int64_t timeout_ms) const {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait_for(l, std::chrono::milliseconds(timeout_ms), [&] { return state_ == s || is_terminal(state_); });
  return state_;
}

}  // namespace kiln::serving
