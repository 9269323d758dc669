// expect_error<E>(f, {"part", ...}): runs `f`, which must throw E (or a
// subclass) with a message containing every part. Error messages are part of
// kiln's contract (they name the problem and the fix), so tests check them.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kiln {

template <class E, class F>
void expect_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one mentioning " << (parts.empty() ? "" : parts[0]);
  } catch (const E& e) {
    for (auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

}  // namespace kiln
