// The manager's decision (TF Serving's AspiredVersionsManager with its
// AvailabilityPreservingPolicy or ResourcePreservingPolicy): given the
// versions a model's policy aspires to and the state of every version the
// core knows, which to load and which to unload now. ServerCore applies the
// plan on its loader threads and asks again after each load or unload, so
// one plan only needs to make the next safe step.
//
//   TransitionPlan p = plan_transitions({3}, {{2, kReady}, {3, kReady}}, {});
//   // p.unload == {2}: version 3 serves, so 2 may go
//
// Availability preserving (default): a version no longer aspired keeps
// serving until an aspired one is Ready; if every aspired version failed it
// keeps serving (a failed load never replaces a working version). Resource
// preserving: aspired versions load only once no other version is live.
// A version is (re)loaded when it is unknown, Disabled, or in Error and its
// model.json changed on disk since the failed load.
// The aspired set itself is aspired_versions(): the model's version policy
// applied to what the source (source.h) found on disk.
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "kiln/serving/core/lifecycle.h"
#include "kiln/serving/core/model_config.h"
#include "kiln/serving/core/source.h"

namespace kiln::serving {

// The versions `policy` aspires to among those on disk; none for a model
// that left the config (`removed`).
std::set<int64_t> aspired_versions(const VersionPolicy& policy, const std::map<int64_t, VersionDir>& on_disk,
                                   bool removed);

// The manager's view of one version the core knows.
struct KnownVersion {
  int64_t version = 0;
  VersionState state = VersionState::kNew;
  bool unload_scheduled = false;  // an unload was already planned
  bool changed_on_disk = false;   // model.json differs from the one last loaded
};

struct TransitionOptions {
  bool removed = false;  // the model left the config: everything goes
  bool resource_preserving = false;
};

struct TransitionPlan {
  std::vector<int64_t> load;    // create a fresh entry and load it
  std::vector<int64_t> unload;  // unload (mark Ready ones as scheduled)
};

TransitionPlan plan_transitions(const std::set<int64_t>& aspired, const std::vector<KnownVersion>& known,
                                const TransitionOptions& options);

}  // namespace kiln::serving
