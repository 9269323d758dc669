// Keras 3 model configs: the fixtures under testdata/keras3/ are written by
// hand to the form Keras 3's model.to_json() documents (__keras_tensor__
// inbound nodes, merge layers called on a list, module/registered_name/
// build_config, DTypePolicy objects). Each loads, builds and runs; kiln writes
// the same structure back; a saved model.json uses it and load_model reads it.
#include <gtest/gtest.h>

#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/layers/dense.h"
#include "kiln/models/functional.h"
#include "kiln/models/model_json.h"
#include "kiln/models/sequential.h"
#include "kiln/testing/testing.h"
#include "kiln/training/train_state.h"

namespace kiln {
namespace {

Json fixture(const std::string& name) { return read_json_file(source_path("kiln/models/testdata/keras3/" + name)); }

// Key order does not matter to Keras: compare as unordered JSON.
nlohmann::json unordered(const Json& j) { return nlohmann::json::parse(j.dump()); }

Json without_compile(Json j) {
  j.erase("compile_config");
  return j;
}

Tensors random_inputs(models::Model& m, int64_t n) {
  Tensors x;
  for (auto& s : m.input_shapes()) x.push_back(at::randn(concrete(s, n)));
  return x;
}

const char* const kFixtures[] = {"sequential.json", "multi_io.json", "shared.json", "nested.json"};

TEST(Keras3Config, EachFixtureLoadsBuildsAndRuns) {
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    ModelPtr m = model_from_json(fixture(name));
    ASSERT_TRUE(m->built());
    Tensors out = m->predict(random_inputs(*m, 5));
    auto shapes = m->output_shapes();
    ASSERT_EQ(out.size(), shapes.size());
    for (size_t i = 0; i < out.size(); ++i) {
      EXPECT_EQ(out[i].size(0), 5);
      EXPECT_EQ(out[i].size(1), shapes[i][1]);
      EXPECT_TRUE(at::isfinite(out[i]).all().item<bool>());
    }
  }
}

TEST(Keras3Config, KilnWritesTheFixturesStructureBack) {
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    Json keras = fixture(name);
    ModelPtr m = model_from_json(keras);
    Json written = model_to_json(*m);
    EXPECT_EQ(unordered(without_compile(written)), unordered(without_compile(keras)))
        << "kiln wrote:\n"
        << without_compile(written).dump(1);
    // And what kiln wrote loads again to the same structure.
    EXPECT_EQ(unordered(without_compile(model_to_json(*model_from_json(written)))), unordered(without_compile(keras)));
  }
}

TEST(Keras3Config, CompileConfigIsHonoured) {
  ModelPtr seq = model_from_json(fixture("sequential.json"));
  ASSERT_TRUE(seq->compiled());
  EXPECT_EQ(seq->compile_args().optimizer->class_name(), "Adam");
  EXPECT_EQ(seq->train_state().metric_names(), (std::vector<std::string>{"loss", "accuracy"}));

  ModelPtr two = model_from_json(fixture("multi_io.json"));
  ASSERT_TRUE(two->compiled());
  EXPECT_DOUBLE_EQ(two->compile_args().optimizer->learning_rate(), 0.01);
  auto& ts = two->train_state();
  ASSERT_EQ(ts.output_losses().size(), 2u);
  EXPECT_EQ(ts.output_losses()[0]->class_name(), "SparseCategoricalCrossentropy");
  EXPECT_EQ(ts.output_losses()[1]->class_name(), "BinaryCrossentropy");
  EXPECT_EQ(ts.output_loss_weights(), (std::vector<double>{1.0, 0.5}));
  EXPECT_EQ(ts.metric_names(),
            (std::vector<std::string>{"loss", "digit_loss", "sign_loss", "digit_accuracy", "sign_accuracy"}));
  // kiln writes the dict forms back.
  Json cc = model_to_json(*two)["compile_config"];
  EXPECT_EQ(cc["loss"]["sign"]["class_name"], "BinaryCrossentropy");
  EXPECT_EQ(cc["loss_weights"], Json::parse(R"({"digit": 1.0, "sign": 0.5})"));
  EXPECT_EQ(cc["metrics"]["digit"][0]["config"]["name"], "accuracy");
  ModelPtr again = model_from_json(model_to_json(*two));
  EXPECT_EQ(again->train_state().metric_names(), ts.metric_names());
  EXPECT_EQ(again->train_state().output_loss_weights(), ts.output_loss_weights());

  ModelPtr nested = model_from_json(fixture("nested.json"));
  EXPECT_EQ(nested->compile_args().optimizer->class_name(), "SGD");
  EXPECT_EQ(nested->train_state().metric_names(), (std::vector<std::string>{"loss", "sparse_categorical_accuracy"}));
}

TEST(Keras3Config, CompileConfigRefusesWhatKilnCannotHonour) {
  auto refuse = [](const char* text, const char* why) {
    try {
      CompileArgs::from_json(Json::parse(text));
      ADD_FAILURE() << "expected ValueError for " << text;
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  refuse(R"({"optimizer": "adam", "loss": "mse", "weighted_metrics": ["mae"]})", "weighted_metrics");
  refuse(R"({"optimizer": "adam", "loss": "mse", "steps_per_execution": 0})", "steps_per_execution");
  refuse(R"({"optimizer": "adam", "loss": "mse", "steps_per_execution": 2.5})", "steps_per_execution");
  EXPECT_EQ(CompileArgs::from_json(Json::parse(R"({"optimizer": "adam", "loss": "mse", "steps_per_execution": 8})"))
                .steps_per_execution,
            8);
  refuse(R"({"optimizer": "adam", "loss": "mse", "run_eagerly": 3})", "run_eagerly");
  refuse(R"({"optimizer": "adam", "loss": "mse", "loss_weights": [1.0, -2.0]})", "loss_weights");
  refuse(R"({"optimizer": "adam", "loss": "mse", "bogus": 1})", "unknown key `bogus`");
  refuse(R"({"optimizer": {"class_name": "Adam", "config": {}, "modul": "keras"}, "loss": "mse"})",
         "unknown key `modul`");
  // Keras's defaults are accepted.
  CompileArgs ok = CompileArgs::from_json(Json::parse(
      R"({"optimizer": "adam", "loss": "mse", "loss_weights": null, "metrics": null, "weighted_metrics": null,
          "run_eagerly": false, "steps_per_execution": 1, "jit_compile": "auto", "auto_scale_loss": true})"));
  EXPECT_EQ(ok.loss->class_name(), "MeanSquaredError");
}

// Values of the wrong JSON type are kiln errors naming the problem, never
// nlohmann's raw type_error (which `kiln` reports as an internal error).
// Found by fuzz/model_json_fuzz.cc.
TEST(Keras3Config, WrongJsonTypesAreClearErrors) {
  auto refuse = [](const char* text, const char* why) {
    try {
      model_from_json(std::string(text));
      ADD_FAILURE() << "expected a kiln error for " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  refuse(R"({"class_name": "Sequential", "config": {"layers": [{"class_name": "InputLayer",
           "config": {"batch_shape": [null, 8]}}, {"class_name": {"unmits": 8}}]}})",
         "a layer must be {\"class_name\"");
  refuse(R"({"class_name": "Sequential", "config": {"input_dtype": 3, "layers": []}})", "`input_dtype` must be");
  refuse(R"({"class_name": "Sequential", "config": {"layers": [{"class_name": "InputLayer",
           "config": {"batch_shape": [null, 8]}}, {"class_name": "Dense", "config": {"units": 2,
           "activation": {"x": 1}}}]}})",
         "Dense");
}

TEST(Keras3Config, SharedLayerIsOneLayerCalledTwice) {
  ModelPtr m = model_from_json(fixture("shared.json"));
  auto embed = m->get_layer("embed");
  EXPECT_EQ(embed->weights().size(), 2u);  // one kernel, one bias for both calls
  EXPECT_EQ(m->weights().size(), 4u);      // embed + score
  // Equal inputs give equal embeddings, so diff = 0 and the score is
  // sigmoid(score's bias) = 0.5: true only if node 0 and node 1 share weights.
  at::Tensor x = at::randn({3, 6});
  at::Tensor out = m->predict(Tensors{x, x})[0];
  EXPECT_TRUE(at::allclose(out, at::full({3, 1}, 0.5)));
  at::Tensor other = m->predict(Tensors{x, at::randn({3, 6})})[0];
  EXPECT_FALSE(at::allclose(other, at::full({3, 1}, 0.5)));
}

TEST(Keras3Config, NestedSequentialIsOneLayerOfTheFunctional) {
  ModelPtr m = model_from_json(fixture("nested.json"));
  auto encoder = std::dynamic_pointer_cast<models::SequentialImpl>(m->get_layer("encoder"));
  ASSERT_TRUE(encoder);
  EXPECT_EQ(encoder->layers().size(), 1u);
  at::Tensor x = at::randn({4, 8});
  at::Tensor h = encoder->predict(x);
  at::Tensor want = m->get_layer("head")->operator()(h);
  EXPECT_TRUE(at::allclose(m->predict(x), want));
}

TEST(Keras3Config, SavedModelJsonUsesKerasFormAndLoads) {
  TempDir dir;
  ModelPtr m = model_from_json(fixture("multi_io.json"));
  const std::string path = dir.path() + "/1";
  m->save(path);
  Json mj = read_json_file(path + "/model.json");
  EXPECT_EQ(mj["module"], "keras.src.models.functional");
  EXPECT_EQ(mj["registered_name"], "Functional");
  const Json& merge = mj["config"]["layers"][3];
  EXPECT_EQ(merge["name"], "merge");
  EXPECT_EQ(merge["inbound_nodes"][0]["args"][0][1]["class_name"], "__keras_tensor__");
  EXPECT_EQ(merge["inbound_nodes"][0]["args"][0][1]["config"]["keras_history"], Json::parse(R"(["extra", 0, 0])"));
  EXPECT_EQ(merge["config"]["dtype"]["class_name"], "DTypePolicy");
  Json keras = fixture("multi_io.json");
  EXPECT_EQ(unordered(mj["config"]), unordered(keras["config"]));
  ModelPtr back = load_model(path);
  Tensors x = random_inputs(*m, 6);
  Tensors a = m->predict(x), b = back->predict(x);
  ASSERT_EQ(b.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_TRUE(at::equal(a[i], b[i]));
  EXPECT_EQ(back->train_state().metric_names(), m->train_state().metric_names());
}

TEST(Keras3Config, KilnsOlderFormStillLoads) {
  // kiln's format before Keras 3's: tensor references as triples, dtype
  // names as strings, build_config input_shapes, Sequential input_dtype.
  Json older = Json::parse(R"({"class_name": "Functional", "config": {
    "name": "old", "trainable": true, "dtype": "float32",
    "layers": [
      {"class_name": "InputLayer", "config": {"batch_shape": [null, 3], "dtype": "float32", "sparse": false, "name": "in"},
       "name": "in", "inbound_nodes": []},
      {"class_name": "Dense", "config": {"name": "d", "trainable": true, "dtype": "float32", "units": 2},
       "name": "d", "inbound_nodes": [{"args": [["in", 0, 0]]}]},
      {"class_name": "Add", "config": {"name": "add", "trainable": true, "dtype": "float32"},
       "name": "add", "inbound_nodes": [{"args": [["d", 0, 0], ["d", 0, 0]]}]}],
    "input_layers": [["in", 0, 0]], "output_layers": [["add", 0, 0]]}})");
  ModelPtr m = model_from_json(older);
  at::Tensor x = at::randn({2, 3});
  EXPECT_TRUE(at::allclose(m->predict(x), 2 * m->get_layer("d")->operator()(x)));
  Json seq = Json::parse(R"({"class_name": "Sequential", "config": {"name": "s", "layers": [
      {"class_name": "Dense", "config": {"units": 2}, "build_config": {"input_shapes": [[null, 3]]}}],
      "build_input_shape": [null, 3], "input_dtype": "float32"}})");
  EXPECT_EQ(model_from_json(seq)->predict(x).size(1), 2);
}

TEST(Keras3Config, Keras2InboundNodesLoad) {
  Json k2 = Json::parse(R"({"class_name": "Functional", "config": {"name": "k2", "layers": [
      {"class_name": "InputLayer", "config": {"batch_input_shape": [null, 3], "dtype": "float32", "sparse": false,
       "ragged": false, "name": "input_1"}, "name": "input_1", "inbound_nodes": []},
      {"class_name": "Dense", "config": {"name": "dense", "units": 2, "dtype": "float32"}, "name": "dense",
       "inbound_nodes": [[["input_1", 0, 0, {}]]]}],
    "input_layers": [["input_1", 0, 0]], "output_layers": [["dense", 0, 0]]}})");
  ModelPtr m = model_from_json(k2);
  EXPECT_EQ(m->predict(at::randn({4, 3})).size(1), 2);
}

TEST(Keras3Config, NestedFunctionalCallsCountFromOne) {
  // Keras numbers a nested Functional model's calls from 1 (node 0 is its
  // own graph's); kiln writes and reads that numbering.
  auto in = layers::Input({3}, at::kFloat, "inner_in");
  auto inner = models::Functional(KerasTensors{in},
                                  KerasTensors{layers::Dense(2, "linear", Json{{"name", "inner_dense"}})(in)}, "inner");
  auto x = layers::Input({3}, at::kFloat, "outer_in");
  auto y = layers::Dense(1, "linear", Json{{"name", "outer_dense"}})((*inner)(x));
  auto outer = models::Functional(KerasTensors{x}, KerasTensors{y}, "outer");
  Json j = model_to_json(*outer);
  const Json& layers = j["config"]["layers"];
  ASSERT_EQ(layers.size(), 3u);
  EXPECT_EQ(layers[1]["module"], "keras.src.models.functional");
  EXPECT_EQ(layers[2]["inbound_nodes"][0]["args"][0]["config"]["keras_history"], Json::parse(R"(["inner", 1, 0])"));
  ModelPtr back = model_from_json(j);
  back->set_weights(outer->get_weights());
  at::Tensor t = at::randn({5, 3});
  EXPECT_TRUE(at::equal(back->predict(t), outer->predict(t)));
  EXPECT_EQ(unordered(model_to_json(*back)), unordered(j));
}

void expect_load_error(const Json& j, const std::string& want) {
  try {
    model_from_json(j);
    ADD_FAILURE() << "expected an error mentioning: " << want;
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

TEST(Keras3Config, UnknownKeysAreErrors) {
  Json j = fixture("shared.json");
  j["bogus"] = 1;
  expect_load_error(j, "unknown key `bogus` in the model JSON");
  j = fixture("shared.json");
  j["config"]["bogus"] = 1;
  expect_load_error(j, "unknown key `bogus` in the Functional config");
  j = fixture("shared.json");
  j["config"]["layers"][2]["bogus"] = 1;
  expect_load_error(j, "unknown key `bogus` in Functional config: layers[2]");
  j = fixture("shared.json");
  j["config"]["layers"][2]["inbound_nodes"][1]["bogus"] = 1;
  expect_load_error(j, "unknown key `bogus`");
  j = fixture("shared.json");
  j["config"]["layers"][2]["config"]["unitz"] = 4;
  expect_load_error(j, "unitz");
  j = fixture("shared.json");
  j["config"]["layers"][2]["config"]["dtype"]["config"]["nam"] = "float32";
  expect_load_error(j, "unknown key `nam`");
  j = fixture("sequential.json");
  j["config"]["bogus"] = 1;
  expect_load_error(j, "unknown key `bogus` in the Sequential config");
  j = fixture("sequential.json");
  j["config"]["layers"][1]["build_config"]["input_shap"] = Json::array({nullptr, 8});
  expect_load_error(j, "unknown key `input_shap`");
  j = fixture("sequential.json");
  j["compile_config"]["metric"] = Json::array();
  expect_load_error(j, "unknown key `metric` in the compile config");
}

TEST(Keras3Config, BadReferencesAreClearErrors) {
  Json j = fixture("shared.json");
  j["config"]["layers"][3]["inbound_nodes"][0]["args"][0][1]["config"]["keras_history"] =
      Json::parse(R"(["embed", 2, 0])");
  expect_load_error(j, "refers to [\"embed\", 2, 0], but layer 'embed' has nodes 0..1 only");
  j = fixture("shared.json");
  j["config"]["layers"][3]["inbound_nodes"][0]["args"][0][1]["config"]["keras_history"] =
      Json::parse(R"(["embd", 0, 0])");
  expect_load_error(j, "no layer named 'embd'");
  j = fixture("shared.json");
  j["config"]["layers"][3]["inbound_nodes"][0]["args"][0][1]["config"]["keras_history"] =
      Json::parse(R"(["embed", 0, 3])");
  expect_load_error(j, "fix the tensor index");
  j = fixture("shared.json");
  j["config"]["output_layers"] = Json::parse(R"([["score", 1, 0]])");
  expect_load_error(j, "`output_layers` refers to [\"score\", 1, 0]");
  j = fixture("shared.json");
  j["config"]["layers"][2]["inbound_nodes"][0]["kwargs"] = Json::parse(R"({"training": true})");
  expect_load_error(j, "call argument `training`");
}

TEST(Keras3Config, LaterCallOfASharedLayerMayUseLayersListedAfterIt) {
  // Keras lists a layer once, at its first call; its second call here needs
  // "mid", which comes after it in the list (Keras defers such nodes).
  Json j = Json::parse(R"({"class_name": "Functional", "config": {"name": "loop", "trainable": true,
    "layers": [
      {"class_name": "InputLayer", "config": {"batch_shape": [null, 3], "dtype": "float32", "name": "in"},
       "name": "in", "inbound_nodes": []},
      {"class_name": "Dense", "config": {"name": "twice", "units": 3}, "name": "twice", "inbound_nodes": [
        {"args": [{"class_name": "__keras_tensor__", "config": {"keras_history": ["in", 0, 0]}}], "kwargs": {}},
        {"args": [{"class_name": "__keras_tensor__", "config": {"keras_history": ["mid", 0, 0]}}], "kwargs": {}}]},
      {"class_name": "Dense", "config": {"name": "mid", "units": 3}, "name": "mid", "inbound_nodes": [
        {"args": [{"class_name": "__keras_tensor__", "config": {"keras_history": ["twice", 0, 0]}}], "kwargs": {}}]}],
    "input_layers": [["in", 0, 0]], "output_layers": [["twice", 1, 0]]}})");
  ModelPtr m = model_from_json(j);
  at::Tensor x = at::randn({2, 3});
  auto twice = m->get_layer("twice");
  auto mid = m->get_layer("mid");
  EXPECT_TRUE(at::allclose(m->predict(x), (*twice)((*mid)((*twice)(x)))));
  // A real cycle is refused.
  j["config"]["layers"][1]["inbound_nodes"][0]["args"][0]["config"]["keras_history"] = Json::parse(R"(["mid", 0, 0])");
  expect_load_error(j, "cycle");
}

}  // namespace
}  // namespace kiln
