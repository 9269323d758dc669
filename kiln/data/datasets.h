// Built-in datasets, as keras.datasets: arrays in memory, read from the
// machine's copy of the data (nothing is downloaded or cached on disk).
//
//   auto d = datasets::fashion_mnist();
//   auto x = d.x_train.to(at::kFloat).div_(255.0);   // (60000, 28, 28) in [0, 1]
//   auto ds = Dataset::from_tensor_slices({x, d.y_train}).shuffle(60000).batch(128);
//
// Thread-safe; each call reads the files again (about a quarter of a second
// for Fashion-MNIST).
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

namespace kiln::datasets {

// keras.datasets.*.load_data()'s ((x_train, y_train), (x_test, y_test)).
struct ImageClassificationData {
  at::Tensor x_train;  // uint8 (N, H, W), as stored: scale it yourself
  at::Tensor y_train;  // int64 (N,) class ids
  at::Tensor x_test;
  at::Tensor y_test;
};

// Fashion-MNIST (Zalando): 60,000 train and 10,000 test 28x28 grey images of
// 10 clothing classes. Images are uint8 (N, 28, 28) exactly as Keras returns
// them; labels are int64 in [0, 10) (the dtype kiln's losses take).
// Files: train-images-idx3-ubyte(.gz), train-labels-idx1-ubyte(.gz),
// t10k-images-idx3-ubyte(.gz), t10k-labels-idx1-ubyte(.gz), looked up in
// `directory`, else $KILN_FASHION_MNIST_DIR, else /usr/share/datasets/fashion-mnist
// (Debian's dataset-fashion-mnist package). NotFoundError saying how to
// install them when absent; FormatError when a file is corrupt or the
// files disagree (counts, image size, label range).
ImageClassificationData fashion_mnist(const std::string& directory = "");

// "T-shirt/top", "Trouser", ..., "Ankle boot": the names of labels 0..9.
const std::vector<std::string>& fashion_mnist_class_names();

// The directory fashion_mnist("") reads.
std::string fashion_mnist_directory();

// A generated sequence task (no files): "are the brackets balanced?".
// Sequences of '(' (token 1) and ')' (token 2), lengths uniform in
// [min_length, max_length], padded at the end with 0 to max_length (use
// Embedding(mask_zero=true) so models skip the padding). Labels: 1 balanced,
// 0 not; half of each split is balanced. Half of the unbalanced sequences
// hold as many '(' as ')' but close one too early (only reading in order
// tells them apart), the rest are random strings. The same seed gives the
// same data (std::mt19937_64); train and test are drawn independently.
// x: int64 (N, max_length); y: int64 (N,). ValueError unless
// 2 <= min_length <= max_length <= 1000 and the sizes are positive.
struct SequenceClassificationData {
  at::Tensor x_train, y_train, x_test, y_test;
};
SequenceClassificationData balanced_brackets(int64_t train_size, int64_t test_size, int64_t min_length,
                                             int64_t max_length, uint64_t seed);

// A generated text classification task (no files, nothing downloaded):
// short English-like sentences about one of 4 topics, "sports",
// "cooking", "technology" and "weather" (labels 0..3, a quarter each in
// expectation). Each sentence has 4 to 16 words: function words, words of
// its topic, words two topics share ("hot", "chip", "stream", "record"...),
// now and then a word of another topic, a capitalised first word, some
// upper-case words, commas and an end mark ("." "!" "?"), so the task needs
// the words, not their case or punctuation, and is not trivial (a word
// count model reaches about 0.9). The same seed gives the same data
// (std::mt19937_64); train and test are drawn independently. Texts are raw
// strings: strings::encode(d.x_train) makes the string tensor a model with
// a TextVectorization takes. ValueError unless the sizes are positive.
struct TextClassificationData {
  std::vector<std::string> x_train, x_test;
  at::Tensor y_train, y_test;  // int64 (N,) class ids
};
TextClassificationData text_topics(int64_t train_size, int64_t test_size, uint64_t seed);

// "sports", "cooking", "technology", "weather": the names of labels 0..3.
const std::vector<std::string>& text_topics_class_names();

}  // namespace kiln::datasets
