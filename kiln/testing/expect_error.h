// expect_error<E>(f, {"part", ...}): runs `f`, which must throw E (or a
// subclass) with a message containing every part. Error messages are part of
// kiln's contract (they name the problem and the fix), so tests check them.
//
// error_of<E>(f): the message of the E that `f` throws, for a test that
// compares the whole message; a test failure (and "") if it throws none.
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

template <class E, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "no exception; expected one";
  return "";
}

}  // namespace kiln
