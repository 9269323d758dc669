// How kiln's programs are linked against LibTorch (cmake/KilnTorchFixups.cmake).
#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "kiln/testing/testing.h"

namespace kiln {
namespace {

// The pip wheel's libtorch.so and libtorch_cpu.so export std::filesystem
// functions of their own; libtorch.so's jump to address 0. Linked the usual
// way (libstdc++ last), every test binary crashed at its first TempDir
// cleanup. kiln links libstdc++ first, so the program's lookup finds the
// standard library's definitions before LibTorch's.
TEST(Toolchain, StdFilesystemResolvesToLibstdcxxNotLibTorch) {
  for (const char* symbol : {"_ZNSt10filesystem10remove_allERKNS_7__cxx114pathE",
                             "_ZNSt10filesystem10remove_allERKNS_7__cxx114pathERSt10error_code"}) {
    void* address = ::dlsym(RTLD_DEFAULT, symbol);
    ASSERT_NE(address, nullptr) << symbol;
    Dl_info info{};
    ASSERT_NE(::dladdr(address, &info), 0) << symbol;
    EXPECT_THAT(std::string(info.dli_fname), ::testing::HasSubstr("libstdc++"))
        << symbol << " resolves to " << info.dli_fname;
  }
  // And the calls work: a tree of 3 directories and 2 files goes at once.
  TempDir dir;
  const std::filesystem::path root = std::filesystem::path(dir.path()) / "tree";
  std::filesystem::create_directories(root / "a" / "b");
  std::ofstream(root / "a" / "x.txt") << "x";
  std::ofstream(root / "a" / "b" / "y.txt") << "y";
  EXPECT_EQ(std::filesystem::remove_all(root), 5u);
  EXPECT_FALSE(std::filesystem::exists(root));
}

}  // namespace
}  // namespace kiln
