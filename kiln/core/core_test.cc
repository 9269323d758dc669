#include <gtest/gtest.h>

#include <thread>

#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/core/initializers.h"
#include "kiln/core/io.h"
#include "kiln/core/json.h"
#include "kiln/core/names.h"
#include "kiln/core/random.h"
#include "kiln/core/shape.h"
#include "kiln/core/threads.h"
#include "kiln/core/variable.h"
#include "kiln/testing/expect_error.h"
#include "kiln/testing/testing.h"

namespace kiln {
namespace {

// Integers read from configs are range-checked: 1e308 as an int64_t was
// -9223372036854775808 (a double out of range converts to garbage), and
// 3e9 as an int wrapped to a negative count.
TEST(Json, IntegerLookupsRefuseFractionsAndOutOfRangeNumbers) {
  const Json cfg = Json::parse(R"({"a": 1e308, "b": 3000000000, "c": 2.5, "d": 64.0, "e": -1, "f": "x", "g": 7})");
  expect_error<ValueError>([&] { get_or<int64_t>(cfg, "a", 0); },
                           {"config key `a` is out of range: it must be an integer from -2^63 to 2^63-1: 1e+308"});
  expect_error<ValueError>([&] { get_or<int>(cfg, "b", 0); },
                           {"config key `b` is out of range: it must be an integer from -2147483648 to 2147483647"});
  expect_error<ValueError>([&] { get_or<int>(cfg, "c", 0); }, {"config key `c` must be a whole number: 2.5"});
  expect_error<ValueError>([&] { get_or<uint32_t>(cfg, "e", 0); }, {"config key `e` is out of range"});
  expect_error<ValueError>([&] { get_or<int>(cfg, "f", 0); }, {"config key `f` has the wrong type (string)"});
  EXPECT_EQ(get_or<int64_t>(cfg, "b", 0), 3000000000);
  EXPECT_EQ(get_or<int>(cfg, "d", 0), 64);
  EXPECT_EQ(get_or<int>(cfg, "g", 0), 7);
  EXPECT_EQ(get_or<int>(cfg, "missing", 5), 5);
  EXPECT_DOUBLE_EQ(get_or<double>(cfg, "c", 0), 2.5);
}

TEST(Names, SnakeCaseMatchesKeras) {
  EXPECT_EQ(to_snake_case("Dense"), "dense");
  EXPECT_EQ(to_snake_case("Conv2D"), "conv2d");
  EXPECT_EQ(to_snake_case("MultiHeadAttention"), "multi_head_attention");
  EXPECT_EQ(to_snake_case("GlobalAveragePooling2D"), "global_average_pooling2d");
  EXPECT_EQ(to_snake_case("BatchNormalization"), "batch_normalization");
}

TEST(Names, UniqueNamesCountPerBase) {
  clear_session();
  EXPECT_EQ(unique_name("dense"), "dense");
  EXPECT_EQ(unique_name("dense"), "dense_1");
  EXPECT_EQ(unique_name("conv2d"), "conv2d");
  reserve_name("dense_7");
  EXPECT_EQ(unique_name("dense"), "dense_8");
  clear_session();
  EXPECT_EQ(unique_name("dense"), "dense");
}

TEST(Shape, PrintsLikeKeras) {
  EXPECT_EQ(shape_to_string({kNone, 28, 28}), "(None, 28, 28)");
  EXPECT_EQ(shape_to_string({kNone}), "(None,)");
  EXPECT_EQ(num_elements({2, 3}), 6);
  EXPECT_EQ(num_elements({kNone, 3}), -1);
}

TEST(DType, PoliciesSplitComputeAndVariable) {
  DTypePolicy p("mixed_bfloat16");
  EXPECT_EQ(p.compute_dtype(), at::kBFloat16);
  EXPECT_EQ(p.variable_dtype(), at::kFloat);
  EXPECT_TRUE(p.is_mixed());
  EXPECT_THROW(DTypePolicy("mixed_float8"), ValueError);
  EXPECT_THROW(dtype_from_string("float31"), ValueError);
}

TEST(Random, SeedRepeatsExactly) {
  set_random_seed(7);
  auto a = at::randn({4});
  auto s1 = next_seed();
  set_random_seed(7);
  auto b = at::randn({4});
  EXPECT_TRUE(at::equal(a, b));
  EXPECT_EQ(s1, next_seed());
}

TEST(Initializers, GlorotUniformLimitAndHeNormalStd) {
  set_random_seed(1);
  auto w = Initializer::get("glorot_uniform")->sample({300, 200}, at::kFloat);
  double limit = std::sqrt(6.0 / 500.0);
  EXPECT_LE(w.abs().max().item<double>(), limit);
  EXPECT_GT(w.abs().max().item<double>(), 0.95 * limit);
  auto h = Initializer::get("he_normal")->sample({400, 400}, at::kFloat);
  EXPECT_NEAR(h.std().item<double>(), std::sqrt(2.0 / 400.0), 0.003);
  EXPECT_LE(h.abs().max().item<double>(), 2.0 * std::sqrt(2.0 / 400.0) / 0.8796 + 1e-6);
  EXPECT_TRUE(at::equal(Initializer::get("zeros")->sample({3}, at::kFloat), at::zeros({3})));
  EXPECT_THROW(Initializer::get("glorot"), ValueError);
  auto round = Initializer::from_json(Initializer::get("he_normal")->to_json());
  EXPECT_EQ(round->class_name(), "HeNormal");
}

TEST(Variables, FactoryUsesScopeAndPolicy) {
  NameScope a("sequential");
  NameScope b("dense_1");
  VariableSpec spec{"kernel", {3, 2}, Initializer::get("ones"), true, std::nullopt};
  auto v = VariableFactory::create(spec, DTypePolicy("mixed_float16"));
  EXPECT_EQ(v->path(), "sequential/dense_1/kernel");
  EXPECT_EQ(v->name(), "kernel");
  EXPECT_EQ(v->dtype(), at::kFloat);  // variables stay float32 under mixed policies
  EXPECT_TRUE(v->value().requires_grad());
  EXPECT_THROW(v->assign(at::zeros({2, 3})), ShapeError);
  v->assign(at::zeros({3, 2}));
  EXPECT_EQ(v->value().sum().item<float>(), 0.f);
}

class HalfDistribution : public Distribution {
 public:
  TensorLayout layout_for(const std::string& path, const Shape& shape) const override {
    return TensorLayout{{"", "model"}};
  }
  at::Tensor distribute_variable(const at::Tensor& v, const TensorLayout&) const override { return v * 0.5; }
};

TEST(Variables, DistributionDecidesLayout) {
  set_distribution(std::make_shared<HalfDistribution>());
  VariableSpec spec{"kernel", {2, 2}, Initializer::get("ones"), true, std::nullopt};
  auto v = VariableFactory::create(spec, DTypePolicy());
  set_distribution(nullptr);
  EXPECT_EQ(v->layout().axes, (std::vector<std::string>{"", "model"}));
  EXPECT_FALSE(v->layout().replicated());
  EXPECT_FLOAT_EQ(v->value().sum().item<float>(), 2.f);
}

TEST(IO, AtomicWriteReplacesWholeFile) {
  TempDir dir;
  auto p = dir.path() + "/f.txt";
  atomic_write_file(p, "hello");
  EXPECT_EQ(read_file(p), "hello");
  atomic_write_file(p, "bye");
  EXPECT_EQ(read_file(p), "bye");
  EXPECT_EQ(list_directory(dir.path()), std::vector<std::string>{"f.txt"});  // no temp left
  EXPECT_THROW(read_file(dir.path() + "/missing"), NotFoundError);
}

TEST(IO, AtomicDirectoryAppearsOnlyOnCommit) {
  TempDir dir;
  auto target = dir.path() + "/3";
  {
    AtomicDirectory d(target);
    atomic_write_file(d.path() + "/model.json", "{}");
    EXPECT_FALSE(path_exists(target));
  }  // not committed: discarded
  EXPECT_FALSE(path_exists(target));
  EXPECT_TRUE(list_directory(dir.path()).empty());
  {
    AtomicDirectory d(target);
    atomic_write_file(d.path() + "/model.json", "{\"v\":1}");
    d.commit();
  }
  EXPECT_EQ(read_file(target + "/model.json"), "{\"v\":1}");
}

TEST(Threads, ConfigureSetsIntraOpAndNeverOversubscribesBlas) {
  EXPECT_EQ(configure_threads(ThreadConfig{2}), 2);
  EXPECT_EQ(num_threads(), 2);
  const int blas = blas_num_threads();
  ASSERT_GT(blas, 0) << "LibTorch's BLAS (" << blas_library_name() << ") should be loaded";
  if (blas_library() == BlasLibrary::kOpenBlas) {
    // Spinning OpenMP threads + a full OpenBLAS pool oversubscribe the cores.
    EXPECT_EQ(blas, omp_threads_passive() ? 2 : 1);
  } else {
    // MKL runs on OpenMP's threads: the same count, no second pool.
    EXPECT_EQ(blas, 2);
  }
  configure_threads(ThreadConfig{1});
  EXPECT_EQ(num_threads(), 1);
  EXPECT_EQ(blas_num_threads(), 1);
}

TEST(Threads, BlasIsTheOneLibTorchWasBuiltWith) {
  const std::string config = at::show_config();
  switch (blas_library()) {
    case BlasLibrary::kMkl:
      EXPECT_NE(config.find("BLAS_INFO=mkl"), std::string::npos) << config;
      EXPECT_STREQ(blas_library_name(), "MKL");
      break;
    case BlasLibrary::kOpenBlas:
      EXPECT_EQ(config.find("BLAS_INFO=mkl"), std::string::npos) << config;
      EXPECT_STREQ(blas_library_name(), "OpenBLAS");
      break;
    case BlasLibrary::kOther:
      EXPECT_EQ(blas_num_threads(), 0) << "a BLAS kiln does not know reports threads";
      break;
  }
}

TEST(Threads, IntraOpThreadCapLowersTheCountsUntilDestroyed) {
  configure_threads(ThreadConfig{2});
  const int blas = blas_num_threads();
  {
    IntraOpThreadCap one(1);
    EXPECT_EQ(num_threads(), 1);
    EXPECT_EQ(blas_num_threads(), 1);
    {
      IntraOpThreadCap four(4);  // above the count in force: no change
      EXPECT_EQ(num_threads(), 1);
      EXPECT_EQ(blas_num_threads(), 1);
    }
    EXPECT_EQ(num_threads(), 1);
    // Tensor work under the cap gives the same result.
    auto a = at::randn({64, 300}), b = at::randn({300, 200});
    EXPECT_TRUE(at::allclose(at::mm(a, b), at::mm(a.to(at::kDouble), b.to(at::kDouble)).to(at::kFloat), 1e-4, 1e-4));
  }
  EXPECT_EQ(num_threads(), 2);
  EXPECT_EQ(blas_num_threads(), blas);
  EXPECT_THROW(IntraOpThreadCap(0), ValueError);
}

TEST(Threads, OpenMpOnlyCapLeavesOpenBlasAndOtherThreadsAlone) {
  configure_threads(ThreadConfig{2});
  const int blas = blas_num_threads();
  {
    IntraOpThreadCap one(1, IntraOpThreadCap::Blas::kLeave);
    EXPECT_EQ(num_threads(), 1);
    EXPECT_EQ(blas_num_threads(), blas);
    int other = 0;  // OpenMP's count is per thread: a new thread gets the global one
    std::thread([&] { other = num_threads(); }).join();
    EXPECT_EQ(other, 2);
  }
  EXPECT_EQ(num_threads(), 2);
  // A thread's own count, as a serving compute worker sets it for its life.
  int inside = 0;
  std::thread([&] {
    EXPECT_EQ(set_thread_intra_op_threads(1), 2);
    inside = num_threads();
  }).join();
  EXPECT_EQ(inside, 1);
  EXPECT_EQ(num_threads(), 2);
  EXPECT_THROW(set_thread_intra_op_threads(0), ValueError);
}

}  // namespace
}  // namespace kiln
