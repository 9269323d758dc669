#include "kiln/data/datasets.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <future>
#include <random>
#include <tuple>

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
  throw NotFoundError("Fashion-MNIST file " + name + "(.gz) not found in " + dir +
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
    throw FormatError("Fashion-MNIST labels " + path + ": found label " + std::to_string(y.max().item<int>()) +
                      ", expected 0..9");
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

// --- balanced brackets --------------------------------------------------------------------------

namespace kiln::datasets {
namespace {

bool balanced(const std::vector<int64_t>& s) {
  int64_t depth = 0;
  for (int64_t t : s) {
    depth += t == 1 ? 1 : -1;
    if (depth < 0) return false;
  }
  return depth == 0;
}

// One example of `label` (1 balanced, 0 not) of a length in [lo, hi].
std::vector<int64_t> bracket_example(bool label, int64_t lo, int64_t hi, std::mt19937_64& rng) {
  auto length = [&](bool even) {
    int64_t n = std::uniform_int_distribution<int64_t>(lo, hi)(rng);
    if (even && n % 2) n += n + 1 <= hi ? 1 : -1;
    return n;
  };
  const bool same_counts = label || std::bernoulli_distribution(0.5)(rng);
  if (same_counts) {
    // k '(' and k ')' shuffled until the order is (label) or is not balanced.
    const int64_t n = length(true);
    std::vector<int64_t> s(n, 2);
    std::fill(s.begin(), s.begin() + n / 2, 1);
    do std::shuffle(s.begin(), s.end(), rng);
    while (balanced(s) != label);
    return s;
  }
  std::vector<int64_t> s;
  do {
    s.assign(length(false), 0);
    for (auto& t : s) t = std::uniform_int_distribution<int64_t>(1, 2)(rng);
  } while (balanced(s));
  return s;
}

std::pair<at::Tensor, at::Tensor> bracket_split(int64_t n, int64_t lo, int64_t hi, std::mt19937_64& rng) {
  at::Tensor x = at::zeros({n, hi}, at::kLong), y = at::empty({n}, at::kLong);
  auto xa = x.accessor<int64_t, 2>();
  auto ya = y.accessor<int64_t, 1>();
  for (int64_t i = 0; i < n; ++i) {
    const bool label = i % 2 == 0 ? std::bernoulli_distribution(0.5)(rng) : ya[i - 1] == 0;  // half each
    auto s = bracket_example(label, lo, hi, rng);
    for (size_t t = 0; t < s.size(); ++t) xa[i][t] = s[t];
    ya[i] = label ? 1 : 0;
  }
  return {x, y};
}

}  // namespace

SequenceClassificationData balanced_brackets(int64_t train_size, int64_t test_size, int64_t min_length,
                                             int64_t max_length, uint64_t seed) {
  if (train_size < 1 || test_size < 1)
    throw ValueError("balanced_brackets: train_size and test_size must be positive. Received: train_size=" +
                     std::to_string(train_size) + ", test_size=" + std::to_string(test_size));
  if (min_length < 2 || max_length < min_length || max_length > 1000)
    throw ValueError(
        "balanced_brackets: lengths must satisfy 2 <= min_length <= max_length <= 1000. Received: "
        "min_length=" +
        std::to_string(min_length) + ", max_length=" + std::to_string(max_length));
  std::mt19937_64 rng(seed);
  SequenceClassificationData d;
  std::tie(d.x_train, d.y_train) = bracket_split(train_size, min_length, max_length, rng);
  std::tie(d.x_test, d.y_test) = bracket_split(test_size, min_length, max_length, rng);
  return d;
}

}  // namespace kiln::datasets

// --- text topics --------------------------------------------------------------------------------

namespace kiln::datasets {
namespace {

const std::vector<std::vector<std::string>>& topic_words() {
  static const std::vector<std::vector<std::string>> words = {
      {"team",   "goal",    "coach",    "player",   "season",  "league",    "score", "match",
       "win",    "striker", "tennis",   "football", "referee", "stadium",   "fans",  "penalty",
       "trophy", "runner",  "marathon", "court",    "defense", "tournament"},
      {"recipe", "oven",  "flour", "garlic", "bake",  "sauce", "onion",  "butter", "pasta",  "kitchen", "chef",
       "salt",   "roast", "soup",  "pepper", "dough", "fry",   "dinner", "spoon",  "simmer", "bread",   "cheese"},
      {"software", "computer",  "laptop",    "code",   "network",  "server", "app",
       "phone",    "robot",     "browser",   "update", "battery",  "screen", "startup",
       "internet", "algorithm", "developer", "data",   "keyboard", "gadget", "wifi"},
      {"rain",        "storm",   "sunny",   "forecast", "wind",   "snow",     "cloudy",
       "temperature", "thunder", "humid",   "frost",    "breeze", "drought",  "flood",
       "hail",        "fog",     "degrees", "umbrella", "sky",    "heatwave", "tornado"}};
  return words;
}

// Words two topics share: {word, topic a, topic b}.
struct SharedWord {
  const char* word;
  int a, b;
};
const std::vector<SharedWord>& shared_words() {
  static const std::vector<SharedWord> words = {
      {"hot", 1, 3},      {"chip", 1, 2},  {"stream", 2, 3}, {"record", 0, 2}, {"pitch", 0, 2}, {"cool", 2, 3},
      {"serve", 0, 1},    {"heat", 0, 1},  {"fast", 0, 2},   {"cold", 1, 3},   {"light", 2, 3}, {"bowl", 0, 1},
      {"pressure", 3, 1}, {"cloud", 2, 3}, {"club", 0, 2},   {"mix", 1, 3},    {"power", 2, 3}, {"final", 0, 2}};
  return words;
}

const std::vector<std::string>& filler_words() {
  static const std::vector<std::string> words = {"the",  "a",     "and",  "is",     "of",     "with", "for",   "in",
                                                 "on",   "this",  "that", "today",  "new",    "very", "we",    "they",
                                                 "was",  "will",  "big",  "great",  "my",     "our",  "after", "again",
                                                 "more", "never", "just", "really", "people", "time", "best",  "it"};
  return words;
}

size_t pick(size_t n, std::mt19937_64& rng) { return (size_t)(rng() % n); }
bool chance(double p, std::mt19937_64& rng) { return (double)(rng() >> 11) * 0x1.0p-53 < p; }

std::string topic_sentence(int topic, std::mt19937_64& rng) {
  const auto& own = topic_words()[topic];
  const int64_t length = 4 + (int64_t)pick(13, rng);
  std::vector<std::string> words;
  bool has_topic_word = false;
  for (int64_t i = 0; i < length; ++i) {
    const double r = (double)(rng() >> 11) * 0x1.0p-53;
    if (r < 0.30) {
      words.push_back(own[pick(own.size(), rng)]);
      has_topic_word = true;
    } else if (r < 0.42) {
      std::vector<const SharedWord*> mine;
      for (auto& w : shared_words())
        if (w.a == topic || w.b == topic) mine.push_back(&w);
      words.push_back(mine[pick(mine.size(), rng)]->word);
    } else if (r < 0.48) {
      const int other = (topic + 1 + (int)pick(3, rng)) % 4;  // a word of another topic
      words.push_back(topic_words()[other][pick(topic_words()[other].size(), rng)]);
    } else {
      words.push_back(filler_words()[pick(filler_words().size(), rng)]);
    }
  }
  if (!has_topic_word) words[pick(words.size(), rng)] = own[pick(own.size(), rng)];
  std::string text;
  for (size_t i = 0; i < words.size(); ++i) {
    std::string w = words[i];
    if (chance(0.05, rng))
      for (auto& c : w) c = (char)std::toupper((unsigned char)c);
    if (i == 0) w[0] = (char)std::toupper((unsigned char)w[0]);
    if (i) text += " ";
    text += w;
    if (i + 1 < words.size() && chance(0.08, rng)) text += ",";
  }
  static const char* const kEnds[] = {".", ".", ".", "!", "?"};
  return text + kEnds[pick(5, rng)];
}

void text_split(int64_t n, std::mt19937_64& rng, std::vector<std::string>* x, at::Tensor* y) {
  *y = at::empty({n}, at::kLong);
  auto ya = y->accessor<int64_t, 1>();
  x->clear();
  x->reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    const int topic = (int)pick(4, rng);
    x->push_back(topic_sentence(topic, rng));
    ya[i] = topic;
  }
}

}  // namespace

const std::vector<std::string>& text_topics_class_names() {
  static const std::vector<std::string> names = {"sports", "cooking", "technology", "weather"};
  return names;
}

TextClassificationData text_topics(int64_t train_size, int64_t test_size, uint64_t seed) {
  if (train_size < 1 || test_size < 1)
    throw ValueError("text_topics: train_size and test_size must be positive. Received: train_size=" +
                     std::to_string(train_size) + ", test_size=" + std::to_string(test_size));
  std::mt19937_64 rng(seed);
  TextClassificationData d;
  text_split(train_size, rng, &d.x_train, &d.y_train);
  text_split(test_size, rng, &d.x_test, &d.y_test);
  return d;
}

}  // namespace kiln::datasets
