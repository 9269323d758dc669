// The manager's version policy as a pure function: every case the core's
// integration tests exercise through real loads, here without a model.
#include "kiln/serving/core/version_manager.h"

#include <gtest/gtest.h>

namespace kiln::serving {
namespace {

using V = std::vector<int64_t>;
constexpr auto kReady = VersionState::kReady;

TEST(VersionManager, AvailabilityPreservingLoadsTheNewVersionBeforeUnloadingTheOld) {
  TransitionPlan p = plan_transitions({2}, {{1, kReady}}, {});
  EXPECT_EQ(p.load, V{2});
  EXPECT_EQ(p.unload, V{});
  p = plan_transitions({2}, {{1, kReady}, {2, VersionState::kLoading}}, {});
  EXPECT_EQ(p.load, V{});
  EXPECT_EQ(p.unload, V{}) << "the old version serves until the new one is Ready";
  p = plan_transitions({2}, {{1, kReady}, {2, kReady}}, {});
  EXPECT_EQ(p.unload, V{1});
  p = plan_transitions({2}, {{1, kReady, /*unload_scheduled=*/true}, {2, kReady}}, {});
  EXPECT_EQ(p.unload, V{}) << "an unload already planned is not planned twice";
}

TEST(VersionManager, AFailedVersionNeverReplacesAWorkingOneAndIsRetriedWhenItChangesOnDisk) {
  TransitionPlan p = plan_transitions({2}, {{1, kReady}, {2, VersionState::kError}}, {});
  EXPECT_EQ(p.load, V{});
  EXPECT_EQ(p.unload, V{});
  p = plan_transitions({2}, {{1, kReady}, {2, VersionState::kError, false, /*changed_on_disk=*/true}}, {});
  EXPECT_EQ(p.load, V{2});
  EXPECT_EQ(p.unload, V{});
  p = plan_transitions({2}, {{1, kReady}, {2, VersionState::kDisabled}}, {});
  EXPECT_EQ(p.load, V{2}) << "a Disabled version aspired again is loaded again";
}

TEST(VersionManager, ResourcePreservingUnloadsFirstAndLoadsOnlyOnceNothingElseIsLive) {
  TransitionOptions rp{.resource_preserving = true};
  TransitionPlan p = plan_transitions({2}, {{1, kReady}}, rp);
  EXPECT_EQ(p.unload, V{1});
  EXPECT_EQ(p.load, V{});
  p = plan_transitions({2}, {{1, VersionState::kQuiescing}}, rp);
  EXPECT_EQ(p.load, V{});
  p = plan_transitions({2}, {{1, VersionState::kDisabled}}, rp);
  EXPECT_EQ(p.load, V{2});
}

TEST(VersionManager, RemovedModelsAndEmptyBasePathsUnloadEverything) {
  TransitionPlan p = plan_transitions({}, {{1, kReady}, {2, VersionState::kNew}}, {.removed = true});
  EXPECT_EQ(p.unload, (V{1, 2}));
  EXPECT_EQ(p.load, V{});
  p = plan_transitions({}, {{1, kReady}}, {});
  EXPECT_EQ(p.unload, V{1}) << "every version directory deleted: nothing is aspired, so the last one goes";
  p = plan_transitions({1, 2}, {}, {});
  EXPECT_EQ(p.load, (V{1, 2}));
}

TEST(VersionManager, AspiredVersionsApplyThePolicyToWhatIsOnDisk) {
  std::map<int64_t, VersionDir> on_disk{{1, {"/b/1", 0}}, {2, {"/b/2", 0}}, {5, {"/b/5", 0}}};
  VersionPolicy latest2;
  latest2.kind = VersionPolicy::Kind::kLatest;
  latest2.num_versions = 2;
  EXPECT_EQ(aspired_versions(latest2, on_disk, false), (std::set<int64_t>{2, 5}));
  EXPECT_EQ(aspired_versions(latest2, on_disk, true), (std::set<int64_t>{})) << "a removed model aspires to none";
  EXPECT_EQ(aspired_versions(latest2, {}, false), (std::set<int64_t>{}));
}

}  // namespace
}  // namespace kiln::serving
