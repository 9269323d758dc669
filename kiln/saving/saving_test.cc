#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <future>

#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/core/json.h"
#include "kiln/core/random.h"
#include "kiln/layers/dense.h"
#include "kiln/layers/dropout.h"
#include "kiln/layers/merging.h"
#include "kiln/models/functional.h"
#include "kiln/models/sequential.h"
#include "kiln/saving/model_io.h"
#include "kiln/saving/safetensors.h"
#include "kiln/testing/testing.h"

namespace kiln {
namespace {

TEST(Safetensors, RoundTripsEveryDtypeBitExactly) {
  TempDir dir;
  NamedTensors in = {
      {"a/kernel", at::randn({3, 4})},
      {"b", at::randn({2}, at::kDouble)},
      {"c", at::randn({5}).to(at::kBFloat16)},
      {"d", at::randn({2, 2}).to(at::kHalf)},
      {"e", at::arange(6, at::kLong).reshape({2, 3})},
      {"f", at::tensor({1, 0}).to(at::kBool)},
      {"g", at::zeros({0, 3})},
      {"h", at::randn({4, 4}).t()},  // non-contiguous input
  };
  save_safetensors(dir.path() + "/w.safetensors", in, {{"format", "kiln"}});
  std::map<std::string, std::string> meta;
  auto out = load_safetensors(dir.path() + "/w.safetensors", &meta);
  ASSERT_EQ(out.size(), in.size());
  EXPECT_EQ(meta["format"], "kiln");
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(out[i].first, in[i].first);
    EXPECT_EQ(out[i].second.scalar_type(), in[i].second.scalar_type());
    EXPECT_TRUE(at::equal(out[i].second, in[i].second)) << in[i].first;
  }
}

TEST(Safetensors, HeaderFollowsTheFormat) {
  auto bytes = encode_safetensors({{"x", at::ones({2}, at::kFloat)}});
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= (uint64_t)(unsigned char)bytes[i] << (8 * i);
  EXPECT_EQ((8 + n) % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 8);
  auto header = Json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["x"]["dtype"], "F32");
  EXPECT_EQ(header["x"]["shape"], Json::array({2}));
  EXPECT_EQ(header["x"]["data_offsets"], Json::array({0, 8}));
}

TEST(Safetensors, EveryTruncationIsAFormatErrorNeverACrash) {
  auto bytes = encode_safetensors({{"x", at::randn({8})}, {"y", at::randn({3, 3})}});
  for (size_t len = 0; len < bytes.size(); ++len) {
    try {
      decode_safetensors(bytes.substr(0, len), "w.safetensors");
      ADD_FAILURE() << "truncation to " << len << " bytes was accepted";
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find("w.safetensors"), std::string::npos);
    }
  }
}

TEST(Safetensors, CorruptHeadersAreRejected) {
  auto good = encode_safetensors({{"x", at::randn({4})}});
  std::string huge = good;
  huge[7] = (char)0x7f;  // absurd header length
  EXPECT_THROW(decode_safetensors(huge, "f"), FormatError);
  std::string not_json = good;
  not_json[9] = '#';
  EXPECT_THROW(decode_safetensors(not_json, "f"), FormatError);
  // Shape that does not match the byte range.
  std::string h = R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})";
  std::string bad(8, '\0');
  bad[0] = (char)h.size();
  bad += h + std::string(16, '\0');
  EXPECT_THROW(decode_safetensors(bad, "f"), FormatError);
  // Overlapping ranges.
  h = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  bad = std::string(8, '\0');
  bad[0] = (char)h.size();
  bad += h + std::string(12, '\0');
  EXPECT_THROW(decode_safetensors(bad, "f"), FormatError);
  EXPECT_THROW(encode_safetensors({{"x", at::ones({1})}, {"x", at::ones({1})}}), ValueError);
}

TEST(Safetensors, MissingFileIsNotFound) {
  EXPECT_THROW(load_safetensors("/nonexistent/w.safetensors"), NotFoundError);
}

std::shared_ptr<models::SequentialImpl> small_mlp() {
  auto m = models::Sequential();
  m->add(layers::Input({6}));
  m->add(layers::Dense(8, "relu"));
  m->add(layers::Dropout(0.5));
  m->add(layers::Dense(3, "softmax"));
  return m;
}

TEST(ModelDirectory, SaveLoadGivesBitIdenticalPredictionsAndCompileState) {
  TempDir dir;
  set_random_seed(3);
  auto model = small_mlp();
  model->compile("adam", "sparse_categorical_crossentropy", {"accuracy"});
  auto x = at::randn({32, 6});
  auto y = at::randint(3, {32}, at::kLong);
  FitArgs fa;
  fa.x = {x};
  fa.y = {y};
  fa.epochs = 2;
  fa.verbose = 0;
  model->fit(fa);
  model->save(dir.path() + "/m/1");
  auto names = list_directory(dir.path() + "/m");
  EXPECT_EQ(names, std::vector<std::string>{"1"});  // no temporary left behind
  auto mj = read_model_json(dir.path() + "/m/1");
  EXPECT_EQ(mj["signatures"]["serving_default"]["inputs"]["inputs"]["shape"], Json::parse("[null, 6]"));
  EXPECT_EQ(mj["signatures"]["serving_default"]["outputs"]["output_0"]["shape"], Json::parse("[null, 3]"));
  auto loaded = load_model(dir.path() + "/m/1");
  EXPECT_TRUE(at::equal(model->predict(x), loaded->predict(x)));
  ASSERT_TRUE(loaded->compiled());
  EXPECT_EQ(loaded->compile_args().optimizer->iterations(), model->compile_args().optimizer->iterations());
  // Training continues from the same optimizer state: one more step matches.
  set_random_seed(9);  // same dropout masks for both steps
  model->train_on_batch({x}, {y});
  set_random_seed(9);
  loaded->train_on_batch({x}, {y});
  EXPECT_TRUE(at::equal(model->predict(x), loaded->predict(x)));
}

TEST(ModelDirectory, FunctionalModelRoundTrips) {
  TempDir dir;
  auto a = layers::Input({4}, at::kFloat, "a");
  auto b = layers::Input({4}, at::kFloat, "b");
  auto h = layers::Dense(5, "relu")(a);
  auto g = layers::Dense(5)(b);
  auto sum = layers::Add()(KerasTensors{h, g});
  auto out = layers::Dense(2)(sum);
  auto model = models::Functional(KerasTensors{a, b}, KerasTensors{out});
  model->save(dir.path() + "/f");
  auto loaded = load_model(dir.path() + "/f");
  auto xa = at::randn({7, 4}), xb = at::randn({7, 4});
  EXPECT_TRUE(at::equal(model->predict({xa, xb})[0], loaded->predict({xa, xb})[0]));
  EXPECT_EQ(loaded->input_names(), (std::vector<std::string>{"a", "b"}));
}

TEST(ModelDirectory, DamagedDirectoriesGiveErrorsNamingTheFile) {
  TempDir dir;
  auto model = small_mlp();
  model->save(dir.path() + "/m");
  const std::string w = dir.path() + "/m/weights.safetensors";
  std::string bytes = read_file(w);
  atomic_write_file(w, bytes.substr(0, bytes.size() / 2));
  try {
    load_model(dir.path() + "/m");
    FAIL() << "a truncated weights file was accepted";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("weights.safetensors"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_model(dir.path() + "/nope"), NotFoundError);
  atomic_write_file(dir.path() + "/m/model.json", "{\"format\": ");
  EXPECT_THROW(load_model(dir.path() + "/m"), FormatError);
  // Weights of another architecture are rejected by name.
  auto other = models::Sequential();
  other->add(layers::Input({6}));
  other->add(layers::Dense(4));
  other->save_weights(dir.path() + "/o.safetensors");
  EXPECT_THROW(model->load_weights(dir.path() + "/o.safetensors"), FormatError);
}

// A header of n bytes `h` followed by `data` bytes of zeros.
std::string with_header(const std::string& h, size_t data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = (char)((h.size() >> (8 * i)) & 0xff);
  return out + h + std::string(data, '\0');
}

// Regression: decoding multiplied the shape without an overflow check and
// read a header of any depth.
// A weights file that is a FIFO (issue 30 §6): refused at once, naming the
// file, instead of open() waiting forever for a writer (which kept a server
// from shutting down). Bounded: should the load block, the FIFO's write end
// is opened and closed so the reader gets EOF and the thread ends.
TEST(ModelDirectory, AWeightsFileThatIsAFifoIsRefusedAtOnce) {
  TempDir dir;
  small_mlp()->save(dir.path() + "/m");
  const std::string w = dir.path() + "/m/weights.safetensors";
  ASSERT_EQ(::unlink(w.c_str()), 0);
  ASSERT_EQ(::mkfifo(w.c_str(), 0600), 0);
  auto load = std::async(std::launch::async, [&]() -> std::string {
    try {
      load_model(dir.path() + "/m");
      return "loaded";
    } catch (const FormatError& e) {
      return e.what();
    } catch (const std::exception& e) {
      return std::string("another error: ") + e.what();
    }
  });
  const bool prompt = load.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  while (load.wait_for(std::chrono::milliseconds(10)) != std::future_status::ready) {
    int fd = ::open(w.c_str(), O_WRONLY | O_NONBLOCK);  // ENXIO until the reader is in open()
    if (fd >= 0) ::close(fd);
  }
  const std::string error = load.get();
  EXPECT_TRUE(prompt) << "load_model waited on the FIFO";
  EXPECT_EQ(error, w + " is not a regular file (a FIFO); kiln reads only regular files: replace it with one");
}

TEST(Safetensors, DeepHeadersAndOverflowingShapesAreFormatErrors) {
  for (size_t depth : {50000, 200000}) {
    std::string h = std::string(depth, '[') + std::string(depth, ']');
    try {
      decode_safetensors(with_header(h, 0), "w.safetensors");
      ADD_FAILURE() << "a header " << depth << " deep was accepted";
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find("64 levels"), std::string::npos) << e.what();
      EXPECT_LT(std::string(e.what()).size(), 300u);
    }
  }
  // 2^32 x 2^32 F32 elements: 2^66 bytes, which wraps to 0 in 64 bits.
  auto h = R"({"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})";
  EXPECT_THROW(decode_safetensors(with_header(h, 0), "f"), FormatError);
  h = R"({"x":{"dtype":"F32","shape":[2147483648,2147483648],"data_offsets":[0,0]}})";  // 2^62 x 4 bytes
  EXPECT_THROW(decode_safetensors(with_header(h, 0), "f"), FormatError);
  h = R"({"x":{"dtype":"F32","shape":{"a":1},"data_offsets":[0,4]}})";
  EXPECT_THROW(decode_safetensors(with_header(h, 4), "f"), FormatError);
}

// Regression: weights stored as F16/F64/I32 were cast to the variable's
// dtype silently, rounding F64 values without a word.
TEST(ModelDirectory, WeightsInAnotherDtypeLoadOnlyWhenNoValueChanges) {
  TempDir dir;
  auto model = small_mlp();
  model->save(dir.path() + "/m");
  const std::string w = dir.path() + "/m/weights.safetensors";
  const NamedTensors saved = load_safetensors(w);
  auto x = at::randn({5, 6});
  auto rewrite = [&](const std::function<at::Tensor(const at::Tensor&)>& f) {
    NamedTensors out;
    for (auto& [name, t] : saved) out.emplace_back(name, f(t));
    save_safetensors(w, out);
  };
  auto weights_of = [](models::Model& m) {
    std::vector<at::Tensor> out;
    for (auto& v : m.weights()) out.push_back(v->value().detach().clone());
    return out;
  };

  // F16 -> float32 widens: loads, with one note, values as the file holds them.
  rewrite([](const at::Tensor& t) { return t.to(at::kHalf); });
  ::testing::internal::CaptureStderr();
  auto half = load_model(dir.path() + "/m");
  const std::string note = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(note.find("float16 to float32"), std::string::npos) << note;
  auto hw = weights_of(*half);
  for (size_t i = 0; i < hw.size(); ++i) {
    EXPECT_EQ(hw[i].scalar_type(), at::kFloat);
    EXPECT_TRUE(at::equal(hw[i], saved[i].second.to(at::kHalf).to(at::kFloat))) << saved[i].first;
  }

  // F64 holding float32 values: exact, bit-identical predictions.
  rewrite([](const at::Tensor& t) { return t.to(at::kDouble); });
  EXPECT_TRUE(at::equal(load_model(dir.path() + "/m")->predict(x)[0], model->predict(x)[0]));

  // I32 holding small integers: exact.
  rewrite([](const at::Tensor& t) { return t.mul(4).round().to(at::kInt); });
  auto ints = weights_of(*load_model(dir.path() + "/m"));
  for (size_t i = 0; i < ints.size(); ++i) EXPECT_TRUE(at::equal(ints[i], saved[i].second.mul(4).round()));

  // F64 values float32 cannot hold: refused, naming the tensor and dtypes.
  rewrite([](const at::Tensor& t) { return t.to(at::kDouble) + 1e-12; });
  try {
    load_model(dir.path() + "/m");
    FAIL() << "float64 weights were rounded silently";
  } catch (const FormatError& e) {
    const std::string m = e.what();
    for (const char* want : {"weights.safetensors", saved[0].first.c_str(), "float64", "float32", "becomes"})
      EXPECT_NE(m.find(want), std::string::npos) << "'" << want << "' not in: " << m;
  }
}

TEST(ModelDirectory, SaveReplacesAnExistingVersionAtomically) {
  TempDir dir;
  auto m1 = small_mlp();
  auto m2 = small_mlp();
  m1->save(dir.path() + "/m");
  m2->save(dir.path() + "/m");
  auto x = at::randn({3, 6});
  EXPECT_TRUE(at::equal(load_model(dir.path() + "/m")->predict(x), m2->predict(x)));
  EXPECT_EQ(list_directory(dir.path()), std::vector<std::string>{"m"});
}

}  // namespace
}  // namespace kiln
