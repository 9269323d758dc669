// A user's subclassed Model (its own C++ call) through the whole life of a
// model: build, fit with metrics on each of its outputs, summary, variable
// paths, save/load_model and predict.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>

#include "kiln/core/io.h"
#include "kiln/layers/dense.h"
#include "kiln/models/model.h"
#include "kiln/models/sequential.h"
#include "kiln/training/training_test_util.h"

namespace kiln {
namespace {

// A shared trunk and two regression heads, as a Keras user would subclass
// keras.Model: sublayers made in the constructor, wiring in call().
class TwoHeads : public models::Model {
 public:
  explicit TwoHeads(const Json& config = Json::object()) : models::Model(config) {
    trunk_ = layers::Dense(16, "relu");
    sum_head_ = layers::Dense(1);
    diff_head_ = layers::Dense(1);
    for (auto& l : {trunk_, sum_head_, diff_head_}) track(l);
  }
  std::string class_name() const override { return "TwoHeads"; }
  Tensors call(const Tensors& inputs, bool training) override {
    at::Tensor h = (*trunk_)(inputs.at(0), training);
    return {(*sum_head_)(h, training), (*diff_head_)(h, training)};
  }

 private:
  LayerPtr trunk_, sum_head_, diff_head_;
};
KILN_REGISTER_LAYER(TwoHeads);

// A fresh directory under the system temp dir, removed at the end.
struct TempDirForModels {
  explicit TempDirForModels(const std::string& name)
      : path((std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()))).string()) {
    std::filesystem::remove_all(path);
  }
  ~TempDirForModels() { std::filesystem::remove_all(path); }
  std::string path;
};

struct HeadsData {
  at::Tensor x, sum, diff;
};
HeadsData make_heads_data(int64_t n) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  at::Tensor x = at::randn({n, 4}, gen, at::TensorOptions().dtype(at::kFloat));
  return {x, x.sum(1, true), x.select(1, 0).unsqueeze(1) - x.select(1, 1).unsqueeze(1)};
}

TEST(SubclassedModel, TrainsWithMetricsOnEachOutputAndRoundTrips) {
  clear_session();
  set_random_seed(5);
  auto model = std::make_shared<TwoHeads>();
  model->compile(CompileArgs::from_names("adam", "mse", {"mae"}));
  HeadsData d = make_heads_data(512);
  FitArgs a;
  a.x = {d.x};
  a.y = {d.sum, d.diff};
  a.epochs = 30;
  a.batch_size = 32;
  a.validation_split = 0.25;
  a.verbose = 0;
  History h = model->fit(a);

  // Keras's naming for several outputs: one copy of each metric per output.
  for (const char* key : {"loss", "output_0_mae", "output_1_mae", "val_loss", "val_output_0_mae", "val_output_1_mae"})
    ASSERT_TRUE(h.history.count(key)) << key;
  EXPECT_EQ(h.history.count("mae"), 0u);
  EXPECT_LT(h.last("loss"), 0.5 * h.history["loss"].front());
  EXPECT_LT(h.last("val_output_0_mae"), h.history["val_output_0_mae"].front());
  EXPECT_LT(h.last("val_output_1_mae"), h.history["val_output_1_mae"].front());

  // Variables live under the model's and each sublayer's name.
  std::vector<std::string> paths;
  for (auto& v : model->weights()) paths.push_back(v->path());
  ASSERT_EQ(paths.size(), 6u);
  EXPECT_EQ(paths[0], model->name() + "/" + model->layers()[0]->name() + "/kernel");
  std::string table = model->summary_string();
  EXPECT_NE(table.find("Total params: 114"), std::string::npos) << table;  // 4*16+16 + 2*(16+1)

  std::string dir = (std::filesystem::temp_directory_path() / "kiln_subclassed_model").string();
  std::filesystem::remove_all(dir);
  model->save(dir);
  ModelPtr loaded = load_model(dir);
  EXPECT_EQ(loaded->class_name(), "TwoHeads");
  Tensors before = model->predict(Tensors{d.x});
  Tensors after = loaded->predict(Tensors{d.x});
  ASSERT_EQ(after.size(), 2u);
  EXPECT_TRUE(at::equal(before[0], after[0]));
  EXPECT_TRUE(at::equal(before[1], after[1]));
  // The loaded model trains on and keeps per-output metrics.
  a.epochs = 1;
  History more = loaded->fit(a);
  EXPECT_TRUE(more.history.count("output_1_mae"));
  std::filesystem::remove_all(dir);
}

// Keras users build a subclassed model explicitly (model.build(shape))
// before training or saving: its variables must live under the model's
// name, as with lazy building, or load_model cannot match them.
TEST(SubclassedModel, ExplicitBuildSavesWeightsLoadModelReads) {
  clear_session();
  set_random_seed(6);
  auto model = std::make_shared<TwoHeads>();
  model->build({{kNone, 4}});
  EXPECT_TRUE(model->built());
  ASSERT_EQ(model->input_shapes().size(), 1u);
  std::vector<std::string> paths;
  for (auto& v : model->weights()) paths.push_back(v->path());
  ASSERT_EQ(paths.size(), 6u);
  for (auto& p : paths) EXPECT_EQ(p.rfind(model->name() + "/", 0), 0u) << p;

  TempDirForModels dir("kiln_subclassed_explicit_build");
  model->save(dir.path);
  ModelPtr loaded = load_model(dir.path);
  HeadsData d = make_heads_data(8);
  Tensors before = model->predict(Tensors{d.x});
  Tensors after = loaded->predict(Tensors{d.x});
  ASSERT_EQ(after.size(), 2u);
  EXPECT_TRUE(at::equal(before[0], after[0]));
  EXPECT_TRUE(at::equal(before[1], after[1]));
}

TEST(SubclassedModel, ExplicitBuildOfASequentialKeepsItsScope) {
  clear_session();
  auto model = models::Sequential(std::vector<LayerPtr>{layers::Dense(3, "relu"), layers::Dense(2)}, "seq");
  model->build({{kNone, 5}});
  EXPECT_TRUE(model->built());
  for (auto& v : model->weights()) EXPECT_EQ(v->path().rfind("seq/", 0), 0u) << v->path();
  TempDirForModels dir("kiln_sequential_explicit_build");
  model->save(dir.path);
  ModelPtr loaded = load_model(dir.path);
  at::Tensor x = at::randn({4, 5});
  EXPECT_TRUE(at::equal(model->predict(x), loaded->predict(x)));
}

}  // namespace
}  // namespace kiln
