#include "kiln/core/registry.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

namespace kiln {
namespace {

using IntRegistry = Registry<int, int>;

TEST(Registry, AddCreateContainsNames) {
  IntRegistry r("widget");
  EXPECT_TRUE(r.add("double", [](int x) { return 2 * x; }));
  EXPECT_TRUE(r.add("add_one", [](int x) { return x + 1; }));
  EXPECT_TRUE(r.contains("double"));
  EXPECT_FALSE(r.contains("triple"));
  EXPECT_EQ(r.create("double", 21), 42);
  EXPECT_EQ(r.create("add_one", 1), 2);
  EXPECT_EQ(r.names(), (std::vector<std::string>{"add_one", "double"}));  // sorted
  EXPECT_EQ(r.joined_names(), "add_one, double");
  EXPECT_EQ(r.kind(), "widget");
}

TEST(Registry, UnknownNameListsTheKnownOnes) {
  IntRegistry r("widget", {{"b", [](int x) { return x; }}, {"a", [](int x) { return x; }}});
  try {
    r.create("c", 0);
    FAIL() << "expected NotFoundError";
  } catch (const NotFoundError& e) {
    EXPECT_EQ(std::string(e.what()), "unknown widget 'c'; known widgets: a, b");
  }
  EXPECT_FALSE(static_cast<bool>(r.find("c")));
  EXPECT_EQ(IntRegistry("widget").not_found_message("x"), "unknown widget 'x'; known widgets: ");
}

TEST(Registry, LaterAddReplaces) {
  IntRegistry r("widget");
  r.add("f", [](int) { return 1; });
  r.add("f", [](int) { return 2; });
  EXPECT_EQ(r.create("f", 0), 2);
  EXPECT_EQ(r.names().size(), 1u);
}

TEST(Registry, ReferenceAndMoveOnlyArguments) {
  Registry<std::unique_ptr<int>, const std::string&, std::unique_ptr<int>> r("maker");
  r.add("len_plus", [](const std::string& s, std::unique_ptr<int> p) {
    return std::make_unique<int>(static_cast<int>(s.size()) + *p);
  });
  auto out = r.create("len_plus", "abc", std::make_unique<int>(4));
  EXPECT_EQ(*out, 7);
}

// A factory may use its own registry (a wrapper creating its inner product):
// create() must not hold the lock while the factory runs.
TEST(Registry, FactoryMayReenterTheRegistry) {
  IntRegistry r("widget");
  r.add("inner", [](int x) { return x + 1; });
  r.add("outer", [&r](int x) { return 10 * r.create("inner", x); });
  EXPECT_EQ(r.create("outer", 1), 20);
}

TEST(Registry, ConcurrentAddAndCreate) {
  IntRegistry r("widget");
  r.add("base", [](int x) { return x; });
  std::atomic<int> sum{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        r.add("t" + std::to_string(t) + "_" + std::to_string(i), [](int x) { return x; });
        sum += r.create("base", 1);
        (void)r.names();
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(sum.load(), 800);
  EXPECT_EQ(r.names().size(), 801u);
}

}  // namespace
}  // namespace kiln
