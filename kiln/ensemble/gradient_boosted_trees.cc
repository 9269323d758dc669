#include "kiln/ensemble/gradient_boosted_trees.h"

#include <xgboost/c_api.h>

#include <filesystem>

#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/core/threads.h"

namespace kiln::ensemble {

namespace {

void check(int rc, const std::string& what) {
  if (rc != 0) throw Error("XGBoost " + what + ": " + XGBGetLastError());
}

// (N, features) contiguous float32.
at::Tensor as_matrix(const at::Tensor& x) {
  if (!x.defined() || x.dim() < 1) throw ShapeError("GradientBoostedTrees needs inputs of shape (batch, ...)");
  return x.reshape({x.size(0), -1}).to(at::kFloat).contiguous();
}

struct DMatrix {
  DMatrixHandle h = nullptr;
  explicit DMatrix(const at::Tensor& m) {
    check(XGDMatrixCreateFromMat(m.data_ptr<float>(), (bst_ulong)m.size(0), (bst_ulong)m.size(1),
                                 std::numeric_limits<float>::quiet_NaN(), &h),
          "DMatrix");
  }
  ~DMatrix() {
    if (h) XGDMatrixFree(h);
  }
  void labels(const at::Tensor& y) {
    at::Tensor f = y.reshape({-1}).to(at::kFloat).contiguous();
    check(XGDMatrixSetFloatInfo(h, "label", f.data_ptr<float>(), (bst_ulong)f.numel()), "labels");
  }
};

Json shape_json(const Shape& s) {
  Json j = Json::array({nullptr});
  for (auto d : s) j.push_back(d);
  return j;
}

}  // namespace

Json GradientBoostedTreesOptions::to_json() const {
  return Json{{"num_class", num_class},
              {"max_depth", max_depth},
              {"eta", eta},
              {"rounds", rounds},
              {"subsample", subsample},
              {"colsample_bytree", colsample_bytree},
              {"nthread", nthread},
              {"early_stopping_rounds", early_stopping_rounds},
              {"seed", seed}};
}

GradientBoostedTreesOptions GradientBoostedTreesOptions::from_json(const Json& j) {
  GradientBoostedTreesOptions o;
  o.num_class = j.value("num_class", o.num_class);
  o.max_depth = j.value("max_depth", o.max_depth);
  o.eta = j.value("eta", o.eta);
  o.rounds = j.value("rounds", o.rounds);
  o.subsample = j.value("subsample", o.subsample);
  o.colsample_bytree = j.value("colsample_bytree", o.colsample_bytree);
  o.nthread = j.value("nthread", o.nthread);
  o.early_stopping_rounds = j.value("early_stopping_rounds", o.early_stopping_rounds);
  o.seed = j.value("seed", o.seed);
  return o;
}

GradientBoostedTrees::GradientBoostedTrees(GradientBoostedTreesOptions options) : o_(options) {
  if (o_.num_class < 2)
    throw ValueError("GradientBoostedTrees: num_class must be >= 2. Received: " + std::to_string(o_.num_class));
  if (o_.rounds < 1)
    throw ValueError("GradientBoostedTrees: rounds must be >= 1. Received: " + std::to_string(o_.rounds));
  if (o_.max_depth < 1)
    throw ValueError("GradientBoostedTrees: max_depth must be >= 1. Received: " + std::to_string(o_.max_depth));
  if (o_.eta <= 0) throw ValueError("GradientBoostedTrees: eta must be > 0. Received: " + std::to_string(o_.eta));
}

GradientBoostedTrees::~GradientBoostedTrees() {
  if (booster_) XGBoosterFree(booster_);
}

void GradientBoostedTrees::fit(const at::Tensor& x, const at::Tensor& y, const at::Tensor& x_val,
                               const at::Tensor& y_val) {
  at::Tensor m = as_matrix(x);
  if (y.numel() != m.size(0))
    throw ShapeError("GradientBoostedTrees.fit: " + std::to_string(m.size(0)) + " samples but " +
                     std::to_string(y.numel()) + " labels");
  if (y.numel() && (y.min().item<int64_t>() < 0 || y.max().item<int64_t>() >= o_.num_class))
    throw ValueError("GradientBoostedTrees.fit: labels must be in [0, " + std::to_string(o_.num_class) + ")");
  input_shape_.assign(x.sizes().begin() + 1, x.sizes().end());
  features_ = m.size(1);
  DMatrix train(m);
  train.labels(y);
  std::unique_ptr<DMatrix> val;
  if (x_val.defined()) {
    val = std::make_unique<DMatrix>(as_matrix(x_val));
    val->labels(y_val);
  }
  if (booster_) XGBoosterFree(booster_);
  booster_ = nullptr;
  DMatrixHandle cache[] = {train.h};
  check(XGBoosterCreate(cache, 1, &booster_), "create");
  auto set = [&](const char* k, const std::string& v) { check(XGBoosterSetParam(booster_, k, v.c_str()), k); };
  set("objective", "multi:softprob");
  set("num_class", std::to_string(o_.num_class));
  set("max_depth", std::to_string(o_.max_depth));
  set("eta", std::to_string(o_.eta));
  set("subsample", std::to_string(o_.subsample));
  set("colsample_bytree", std::to_string(o_.colsample_bytree));
  set("nthread", std::to_string(o_.nthread > 0 ? o_.nthread : num_threads()));
  set("seed", std::to_string(o_.seed));
  set("tree_method", "hist");
  set("eval_metric", "mlogloss");
  set("verbosity", "0");
  double best = std::numeric_limits<double>::infinity();
  best_iteration_ = o_.rounds - 1;
  for (int i = 0; i < o_.rounds; ++i) {
    check(XGBoosterUpdateOneIter(booster_, i, train.h), "update");
    if (val && o_.early_stopping_rounds > 0) {
      DMatrixHandle dm[] = {val->h};
      const char* names[] = {"val"};
      const char* out = nullptr;
      check(XGBoosterEvalOneIter(booster_, i, dm, names, 1, &out), "eval");
      // "[i]\tval-mlogloss:0.123"
      std::string s(out);
      double loss = std::stod(s.substr(s.rfind(':') + 1));
      if (loss < best) {
        best = loss;
        best_iteration_ = i;
      } else if (i - best_iteration_ >= o_.early_stopping_rounds) {
        break;
      }
    }
  }
}

at::Tensor GradientBoostedTrees::predict_proba(const at::Tensor& x) {
  if (!booster_) throw StateError("GradientBoostedTrees: call fit() or load() before predicting");
  at::Tensor m = as_matrix(x);
  if (m.size(1) != features_)
    throw ShapeError("GradientBoostedTrees was trained on " + std::to_string(features_) + " features. Received " +
                     std::to_string(m.size(1)));
  DMatrix d(m);
  bst_ulong len = 0;
  const float* out = nullptr;
  // Trees up to the best iteration (early stopping) only.
  check(XGBoosterPredict(booster_, d.h, 0, (unsigned)(best_iteration_ + 1), 0, &len, &out), "predict");
  if ((int64_t)len != m.size(0) * o_.num_class) throw Error("XGBoost predict returned an unexpected size");
  return at::from_blob(const_cast<float*>(out), {m.size(0), (int64_t)o_.num_class}, at::kFloat).clone();
}

Tensors GradientBoostedTrees::predict(const Tensors& x, int64_t) {
  if (x.size() != 1) throw ValueError("GradientBoostedTrees takes one input. Received " + std::to_string(x.size()));
  return {predict_proba(x[0])};
}

Json GradientBoostedTrees::signatures() {
  return Json{
      {"serving_default",
       Json{{"inputs", Json{{"inputs", Json{{"dtype", "float32"}, {"shape", shape_json(input_shape_)}}}}},
            {"outputs", Json{{"probabilities", Json{{"dtype", "float32"}, {"shape", shape_json({o_.num_class})}}}}},
            {"method_name", "predict"}}}};
}

void GradientBoostedTrees::save_to(const std::string& dir) {
  if (!booster_) throw StateError("GradientBoostedTrees: nothing to save; call fit() first");
  AtomicDirectory out(dir);
  check(XGBoosterSaveModel(booster_, join_path(out.path(), "xgboost.json").c_str()), "save");
  Json mj{{"format", "kiln.model"},
          {"format_version", 1},
          {"class_name", "GradientBoostedTrees"},
          {"config", o_.to_json()},
          {"input_shape", input_shape_},
          {"features", features_},
          {"best_iteration", best_iteration_},
          {"signatures", signatures()},
          {"weights", "xgboost.json"}};
  atomic_write_file(join_path(out.path(), "model.json"), mj.dump(2));
  out.commit();
}

std::shared_ptr<GradientBoostedTrees> GradientBoostedTrees::load(const std::string& dir) {
  const std::string mpath = join_path(dir, "model.json");
  Json mj = read_json_file(mpath);
  if (mj.value("class_name", "") != "GradientBoostedTrees")
    throw FormatError(mpath + " does not describe a GradientBoostedTrees model");
  auto g = std::make_shared<GradientBoostedTrees>(GradientBoostedTreesOptions::from_json(require(mj, "config", mpath)));
  g->input_shape_ = require(mj, "input_shape", mpath).get<Shape>();
  g->features_ = require(mj, "features", mpath).get<int64_t>();
  g->best_iteration_ = mj.value("best_iteration", g->o_.rounds - 1);
  const std::string wpath = join_path(dir, "xgboost.json");
  if (!std::filesystem::exists(wpath)) throw FormatError(wpath + " is missing; the model directory is incomplete");
  check(XGBoosterCreate(nullptr, 0, &g->booster_), "create");
  if (XGBoosterLoadModel(g->booster_, wpath.c_str()) != 0)
    throw FormatError(wpath + " is not a valid XGBoost model: " + XGBGetLastError());
  return g;
}

}  // namespace kiln::ensemble
