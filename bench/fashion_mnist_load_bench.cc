// Loading Fashion-MNIST: datasets::fashion_mnist() against the same four
// files read in this run by
//   read_idx:  data::read_idx on each file, one after another (the work the
//              loader cannot avoid: inflate and copy into tensors);
//   Python:    Keras's loader (gzip.open(...).read(), the bytes kept as they
//              are; bench/fashion_mnist_peer.py), zlib without kiln.
// Runs alternate so that drift hits all alike; the ratios of the fastest runs
// are the figures (other processes on a shared machine only ever add time),
// medians beside them.
//
//   build/bench/fashion_mnist_load_bench [--runs 5] [--max-ratio R]
// Exits 1 if --max-ratio is given and fashion_mnist()/Python exceeds it, 2 on
// a bad flag, 3 when the data is not installed (apt-get install
// dataset-fashion-mnist).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/python_peer.h"
#include "kiln/core/cpu_features.h"
#include "kiln/core/io.h"
#include "kiln/core/threads.h"
#include "kiln/data/datasets.h"
#include "kiln/data/readers.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double fastest(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

template <class F>
double seconds_of(F&& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::printf("CPU: %s\n", kiln::cpu_features().summary().c_str());
  int runs = 5;
  double max_ratio = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--runs") {
      runs = std::max(1, std::atoi(argv[i + 1]));
    } else if (a == "--max-ratio") {
      max_ratio = std::atof(argv[i + 1]);
    } else {
      std::fprintf(stderr, "unknown flag %s (flags: --runs N, --max-ratio R)\n", argv[i]);
      return 2;
    }
  }
  const int threads = kiln::configure_threads();
  const std::string dir = kiln::datasets::fashion_mnist_directory();
  std::vector<std::string> files;
  for (const char* name :
       {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}) {
    const std::string base = kiln::join_path(dir, name);
    files.push_back(kiln::path_exists(base + ".gz") ? base + ".gz" : base);
    if (!kiln::path_exists(files.back())) {
      std::fprintf(stderr, "Fashion-MNIST is not installed in %s (apt-get install dataset-fashion-mnist)\n",
                   dir.c_str());
      return 3;
    }
  }
  std::printf("data: %s, intra-op threads %d, %d runs\n", dir.c_str(), threads, runs);

  std::vector<double> loader, reads, python;
  std::string peer_args = "fashion_mnist_peer.py";
  for (const auto& f : files) peer_args += " " + f;
  for (int r = 0; r < runs; ++r) {
    loader.push_back(seconds_of([] { kiln::datasets::fashion_mnist(); }));
    reads.push_back(seconds_of([&] {
      for (const auto& f : files) kiln::data::read_idx(f);
    }));
    python.push_back(kiln::bench::run_python_peer(peer_args)["seconds"].get<double>());
  }
  const double vs_reads = fastest(loader) / fastest(reads), vs_python = fastest(loader) / fastest(python);
  std::printf("fashion_mnist(): fastest %.3f s, median %.3f s\n", fastest(loader), median(loader));
  std::printf("read_idx x4:     fastest %.3f s, median %.3f s\n", fastest(reads), median(reads));
  std::printf("Python (Keras):  fastest %.3f s, median %.3f s\n", fastest(python), median(python));
  std::printf("ratio fashion_mnist()/read_idx: %.3f (medians %.3f)\n", vs_reads, median(loader) / median(reads));
  std::printf("ratio fashion_mnist()/Python:   %.3f (medians %.3f)\n", vs_python, median(loader) / median(python));
  if (max_ratio > 0 && vs_python > max_ratio) {
    std::printf("FAIL: ratio %.3f > --max-ratio %.3f\n", vs_python, max_ratio);
    return 1;
  }
  return 0;
}
