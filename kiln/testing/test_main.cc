// main() for every kiln test binary: thread set-up as the CLI does it
// (KILN_NUM_THREADS, set to 1 by ctest so parallel tests do not
// oversubscribe), and GPU tests (named *_CUDA*) filtered out with a message
// when no GPU is present. SIGPIPE is ignored, as in the servers under test:
// a TLS client (OpenSSL writes with write()) whose peer refused it must get
// an error, not end the test binary.
//
// The suite computes on the CPU even on a GPU machine (KILN_DEVICE=cpu
// unless set, inherited by the programs tests start): its expected values
// are CPU results. Tests named *CUDA* choose their GPU with a DeviceScope.
#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <iostream>

#include "kiln/core/threads.h"
#include "kiln/core/torch_compat.h"

int main(int argc, char** argv) {
  kiln::prepare_thread_environment(argv);
  std::signal(SIGPIPE, SIG_IGN);
  ::setenv("KILN_DEVICE", "cpu", /*overwrite=*/0);
  ::testing::InitGoogleTest(&argc, argv);
  kiln::configure_threads();
  if (!kiln::compat::cuda_available()) {
    std::string filter = ::testing::GTEST_FLAG(filter);
    if (filter.find("CUDA") == std::string::npos) {
      ::testing::GTEST_FLAG(filter) = filter + (filter.find('-') == std::string::npos ? "-" : ":") + "*CUDA*";
      if (!::testing::GTEST_FLAG(list_tests))
        std::cout << "kiln: no GPU found; tests named *CUDA* are skipped (they check the CUDA build path)\n";
    }
  }
  return RUN_ALL_TESTS();
}
