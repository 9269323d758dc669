#include "kiln/data/datasets.h"

#include <cstdlib>
#include <future>

#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/data/readers.h"

namespace kiln::datasets {
namespace {

constexpr const char* kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// `name`.gz or `name` in `dir`.
std::string find_file(const std::string& dir, const std::string& name) {
  for (const std::string& candidate : {join_path(dir, name + ".gz"), join_path(dir, name)}) {
    if (path_exists(candidate)) return candidate;
  }
  throw NotFoundError(
      "Fashion-MNIST file " + name + "(.gz) not found in " + dir +
      ". Install the data with `scripts/setup.sh` or `apt-get install dataset-fashion-mnist`, "
      "or point KILN_FASHION_MNIST_DIR at a directory holding the four IDX files.");
}

at::Tensor read_labels(const std::string& path, int64_t count) {
  at::Tensor y = data::read_idx(path);
  if (y.dim() != 1 || y.scalar_type() != at::kByte) {
    throw FormatError("Fashion-MNIST labels " + path + ": expected a 1-D uint8 IDX file");
  }
  if (y.size(0) != count) {
    throw FormatError("Fashion-MNIST labels " + path + " hold " + std::to_string(y.size(0)) +
                      " labels, but the images file holds " + std::to_string(count) + " images");
  }
  if (count > 0 && y.max().item<int>() >= 10) {
    throw FormatError("Fashion-MNIST labels " + path + ": found label " +
                      std::to_string(y.max().item<int>()) + ", expected 0..9");
  }
  return y.to(at::kLong);
}

void check_images(const std::string& path, const at::Tensor& x) {
  if (x.dim() != 3 || x.size(1) != 28 || x.size(2) != 28 || x.scalar_type() != at::kByte) {
    throw FormatError("Fashion-MNIST images " + path + ": expected uint8 (N, 28, 28) images");
  }
}

}  // namespace

std::string fashion_mnist_directory() {
  const char* env = std::getenv("KILN_FASHION_MNIST_DIR");
  return env && *env ? env : kDefaultFashionMnistDir;
}

const std::vector<std::string>& fashion_mnist_class_names() {
  static const std::vector<std::string> names = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                                 "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return names;
}

ImageClassificationData fashion_mnist(const std::string& directory) {
  const std::string dir = directory.empty() ? fashion_mnist_directory() : directory;
  const std::string train_x = find_file(dir, "train-images-idx3-ubyte");
  const std::string train_y = find_file(dir, "train-labels-idx1-ubyte");
  const std::string test_x = find_file(dir, "t10k-images-idx3-ubyte");
  const std::string test_y = find_file(dir, "t10k-labels-idx1-ubyte");
  // Decompressing the train images is most of the work: do it beside the rest.
  auto train_images = std::async(std::launch::async, [&] { return data::read_idx(train_x); });
  ImageClassificationData d;
  d.x_test = data::read_idx(test_x);
  check_images(test_x, d.x_test);
  d.y_test = read_labels(test_y, d.x_test.size(0));
  d.x_train = train_images.get();
  check_images(train_x, d.x_train);
  d.y_train = read_labels(train_y, d.x_train.size(0));
  return d;
}

}  // namespace kiln::datasets
