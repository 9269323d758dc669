#include "kiln/serving/core/version_manager.h"

#include <map>

namespace kiln::serving {

std::set<int64_t> aspired_versions(const VersionPolicy& policy, const std::map<int64_t, VersionDir>& on_disk,
                                   bool removed) {
  if (removed) return {};
  std::vector<int64_t> available;
  for (auto& [v, d] : on_disk) available.push_back(v);
  std::vector<int64_t> selected = policy.select(available);
  return std::set<int64_t>(selected.begin(), selected.end());
}

TransitionPlan plan_transitions(const std::set<int64_t>& aspired, const std::vector<KnownVersion>& known,
                                const TransitionOptions& o) {
  std::map<int64_t, const KnownVersion*> by_version;
  for (auto& k : known) by_version[k.version] = &k;
  bool any_aspired_ready = false;
  for (int64_t v : aspired) {
    auto it = by_version.find(v);
    if (it != by_version.end() && it->second->state == VersionState::kReady) any_aspired_ready = true;
  }
  TransitionPlan plan;
  bool others_live = false;
  for (auto& k : known) {
    if (aspired.count(k.version)) continue;
    if (k.state == VersionState::kNew) {
      plan.unload.push_back(k.version);
    } else if (k.state == VersionState::kReady && !k.unload_scheduled) {
      if (o.removed || o.resource_preserving || any_aspired_ready || aspired.empty())
        plan.unload.push_back(k.version);
      else
        others_live = true;
    }
    if (k.state == VersionState::kLoading || k.state == VersionState::kQuiescing ||
        k.state == VersionState::kUnloading || k.state == VersionState::kReady)
      others_live = true;
  }
  if (o.resource_preserving && others_live) return plan;
  for (int64_t v : aspired) {
    auto it = by_version.find(v);
    bool fresh = it == by_version.end() || it->second->state == VersionState::kDisabled ||
                 (it->second->state == VersionState::kError && it->second->changed_on_disk);
    if (fresh) plan.load.push_back(v);
  }
  return plan;
}

}  // namespace kiln::serving
