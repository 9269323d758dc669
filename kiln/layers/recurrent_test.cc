// Recurrent layers (recurrent.h) and masking (layer.h, masking.h):
//   - outputs and gradients against PyTorch's nn.LSTM / nn.GRU / nn.RNN
//     (golden data from scripts/golden/make_golden.py, Keras's weight layout
//     mapped from torch's there), masked (packed sequences) and not;
//   - masks made by Embedding(mask_zero) and Masking flowing through
//     Sequential and Functional models: a padded, masked batch gives each
//     sequence's unpadded outputs and final states;
//   - Keras's weight names, config defaults and errors.
// The conformance cases for these layers are in conformance_test.cc.
#include <gtest/gtest.h>

#include "kiln/core/names.h"
#include "kiln/core/torch_compat.h"
#include "kiln/layers/dense.h"
#include "kiln/layers/embedding.h"
#include "kiln/layers/masking.h"
#include "kiln/layers/recurrent.h"
#include "kiln/models/functional.h"
#include "kiln/models/sequential.h"
#include "kiln/testing/expect_error.h"
#include "kiln/testing/golden.h"
#include "kiln/testing/testing.h"

namespace kiln {
namespace {

at::Tensor lengths_mask(const std::vector<int64_t>& lengths, int64_t steps) {
  at::Tensor m = at::zeros({(int64_t)lengths.size(), steps}, at::kBool);
  for (size_t i = 0; i < lengths.size(); ++i) m[i].narrow(0, 0, lengths[i]).fill_(true);
  return m;
}

// --- golden: PyTorch ------------------------------------------------------------------------

TEST(RecurrentGolden, OutputsAndGradientsMatchPyTorch) {
  Json golden = load_golden("kiln/layers/testdata/recurrent_golden.json");
  ASSERT_GE(golden["cases"].size(), 10u);
  for (auto& c : golden["cases"]) {
    const std::string name = c["name"].get<std::string>();
    SCOPED_TRACE(name);
    clear_session();
    LayerPtr layer = layer_from_json(c["layer"]);
    at::Tensor x = golden_tensor(c["x"]).clone().requires_grad_(true);
    layer->build_if_needed({Shape(x.sizes().begin(), x.sizes().end())});
    Tensors weights;
    for (auto& w : c["weights"]) weights.push_back(golden_tensor(w));
    layer->set_weights(weights);
    Tensors masks;
    if (!c["lengths"].is_null()) masks = {lengths_mask(c["lengths"].get<std::vector<int64_t>>(), x.size(1))};
    Tensors out_masks;
    Tensors out = layer->call_with_masks({x}, masks, false, &out_masks);
    ASSERT_EQ(out.size(), c["outputs"].size());
    at::Tensor loss = at::zeros({});
    for (size_t i = 0; i < out.size(); ++i) {
      EXPECT_TRUE(tensors_close(out[i], golden_tensor(c["outputs"][i]), 1e-4, 1e-5)) << "output " << i;
      loss = loss + (out[i] * golden_tensor(c["r"][i])).sum();
    }
    // The sequence output keeps the input mask; states carry none.
    EXPECT_EQ(out_masks.size(), out.size());
    EXPECT_EQ(out_masks[0].defined(), !masks.empty());
    for (size_t i = 1; i < out_masks.size(); ++i) EXPECT_FALSE(out_masks[i].defined());

    std::vector<at::Tensor> wrt = {x};
    for (auto& v : layer->weights()) wrt.push_back(v->value());
    auto grads = compat::grad({loss}, wrt);
    EXPECT_TRUE(tensors_close(grads[0], golden_tensor(c["x_grad"]), 1e-4, 1e-5)) << "x gradient";
    ASSERT_EQ(grads.size() - 1, c["weight_grads"].size());
    for (size_t i = 1; i < grads.size(); ++i)
      EXPECT_TRUE(tensors_close(grads[i], golden_tensor(c["weight_grads"][i - 1]), 1e-4, 1e-5))
          << layer->weights()[i - 1]->path() << " gradient";
  }
}

// --- weights, config ------------------------------------------------------------------------

TEST(Recurrent, KerasWeightNamesShapesAndInitialValues) {
  clear_session();
  auto lstm = layers::LSTM(Json{{"units", 3}});
  (*lstm)(at::randn({2, 4, 5}));
  ASSERT_EQ(lstm->weights().size(), 3u);
  EXPECT_EQ(lstm->weights()[0]->path(), "lstm/lstm_cell/kernel");
  EXPECT_EQ(lstm->weights()[1]->path(), "lstm/lstm_cell/recurrent_kernel");
  EXPECT_EQ(lstm->weights()[2]->path(), "lstm/lstm_cell/bias");
  EXPECT_EQ(lstm->kernel()->shape(), (Shape{5, 12}));
  EXPECT_EQ(lstm->recurrent_kernel()->shape(), (Shape{3, 12}));
  // unit_forget_bias: the forget gate's quarter starts at 1, the rest at 0.
  at::Tensor expected_bias = at::zeros({12});
  expected_bias.narrow(0, 3, 3).fill_(1.0);
  EXPECT_TRUE(at::equal(lstm->bias()->value(), expected_bias));
  // orthogonal recurrent kernel: the (3, 12) matrix has orthonormal rows.
  at::Tensor u = lstm->recurrent_kernel()->value();
  EXPECT_TRUE(at::allclose(at::matmul(u, u.t()), at::eye(3), 1e-5, 1e-5));

  auto gru = layers::GRU(Json{{"units", 3}});
  (*gru)(at::randn({2, 4, 5}));
  EXPECT_EQ(gru->weights()[0]->path(), "gru/gru_cell/kernel");
  EXPECT_EQ(gru->bias()->shape(), (Shape{2, 9}));  // reset_after: input and recurrent rows
  EXPECT_EQ(layers::GRU(Json{{"units", 3}, {"reset_after", false}})->to_json()["config"]["reset_after"], false);
  auto rnn = layers::SimpleRNN(Json{{"units", 3}});
  (*rnn)(at::randn({2, 4, 5}));
  EXPECT_EQ(rnn->weights()[1]->path(), "simple_rnn/simple_rnn_cell/recurrent_kernel");
  EXPECT_EQ(rnn->count_params(), 5 * 3 + 3 * 3 + 3);

  auto bi = layers::Bidirectional(Json{{"layer", {{"class_name", "LSTM"}, {"config", {{"units", 2}}}}}});
  (*bi)(at::randn({2, 4, 5}));
  EXPECT_EQ(bi->weights()[0]->path(), "bidirectional/forward_lstm_1/lstm_cell/kernel");
  EXPECT_EQ(bi->weights()[3]->path(), "bidirectional/backward_lstm_1/lstm_cell/kernel");
  EXPECT_TRUE(bi->backward_layer()->go_backwards());
  auto td = layers::TimeDistributed(Json{{"layer", {{"class_name", "Dense"}, {"config", {{"units", 2}}}}}});
  EXPECT_EQ((*td)(at::randn({2, 4, 5})).sizes(), (std::vector<int64_t>{2, 4, 2}));
  EXPECT_EQ(td->weights()[0]->path(), "time_distributed/dense/kernel");
}

TEST(Recurrent, KerasDefaultsInConfig) {
  clear_session();
  Json c = layers::LSTMImpl(Json{{"units", 4}}).get_config();
  EXPECT_EQ(c["activation"], "tanh");
  EXPECT_EQ(c["recurrent_activation"], "sigmoid");
  EXPECT_EQ(c["unit_forget_bias"], true);
  EXPECT_EQ(c["recurrent_initializer"]["class_name"], "Orthogonal");
  EXPECT_EQ(c["kernel_initializer"]["class_name"], "GlorotUniform");
  EXPECT_EQ(c["return_sequences"], false);
  EXPECT_EQ(c["stateful"], false);
  EXPECT_EQ(layers::GRUImpl(Json{{"units", 4}}).get_config()["reset_after"], true);
  EXPECT_FALSE(layers::SimpleRNNImpl(Json{{"units", 4}}).get_config().contains("recurrent_activation"));
  EXPECT_EQ(layers::BidirectionalImpl(Json{{"layer", {{"class_name", "GRU"}, {"config", {{"units", 2}}}}}})
                .get_config()["merge_mode"],
            "concat");
}

TEST(Recurrent, BadConfigsNameTheProblem) {
  expect_error<ValueError>([] { (void)layers::LSTMImpl(Json{{"units", 0}}); }, {"LSTM", "`units`", "units=0"});
  expect_error<ValueError>([] { (void)layers::LSTMImpl(Json{{"units", 2}, {"stateful", true}}); }, {"`stateful`"});
  expect_error<ValueError>([] { (void)layers::GRUImpl(Json{{"units", 2}, {"dropout", 1.0}}); }, {"`dropout`"});
  expect_error<ValueError>(
      [] {
        (void)layers::SimpleRNNImpl(Json{{"units", 2}, {"recurrent_activation", "tanh"}});
      },
      {"recurrent_activation"});
  expect_error<ValueError>(
      [] {
        (void)layers::LSTMImpl(Json{{"units", 2}, {"unit_forget_bias", true}, {"typo", 1}});
      },
      {"typo"});
  Json lstm = {{"class_name", "LSTM"}, {"config", {{"units", 2}}}};
  expect_error<ValueError>(
      [&] {
        (void)layers::BidirectionalImpl(Json{{"layer", lstm}, {"merge_mode", "max"}});
      },
      {"`merge_mode`", "max"});
  expect_error<ValueError>(
      [] {
        (void)layers::BidirectionalImpl(Json{{"layer", {{"class_name", "Dense"}, {"config", {{"units", 2}}}}}});
      },
      {"recurrent layer", "Dense"});
  expect_error<ValueError>([] { (void)layers::BidirectionalImpl(Json::object()); }, {"missing `layer`"});
  expect_error<ValueError>(
      [&] {
        (void)layers::BidirectionalImpl(
            Json{{"layer", lstm}, {"backward_layer", {{"class_name", "LSTM"}, {"config", {{"units", 2}}}}}});
      },
      {"go_backwards"});
  auto l = layers::LSTM(Json{{"units", 2}});
  expect_error<ShapeError>([&] { (*l)(at::randn({2, 5})); }, {"(batch, time, features)"});
  (*l)(at::randn({2, 3, 4}));
  expect_error<ShapeError>(
      [&] {
        (void)l->call_with_masks({at::randn({2, 3, 4})}, {at::ones({2, 4}, at::kBool)}, false, nullptr);
      },
      {"mask", "(2, 3)"});
}

TEST(Recurrent, InitialStatesAreExtraInputs) {
  clear_session();
  auto lstm = layers::LSTM(Json{{"units", 3}, {"return_state", true}});
  at::Tensor x = at::randn({2, 4, 5});
  auto first = (*lstm)(Tensors{x.narrow(1, 0, 2)});
  // Running the first two steps, then the last two from the states, is the whole run.
  auto rest = (*lstm)(Tensors{x.narrow(1, 2, 2), first[1], first[2]});
  auto whole = (*lstm)(Tensors{x});
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(at::allclose(rest[i], whole[i], 1e-5, 1e-6)) << i;
}

TEST(Recurrent, DropoutOnlyInTraining) {
  clear_session();
  auto gru = layers::GRU(Json{{"units", 4}, {"dropout", 0.5}, {"recurrent_dropout", 0.5}});
  at::Tensor x = at::randn({3, 6, 5});
  at::Tensor a = (*gru)(x, false), b = (*gru)(x, false);
  EXPECT_TRUE(at::equal(a, b));
  at::manual_seed(1);
  at::Tensor t = (*gru)(x, true);
  EXPECT_FALSE(at::allclose(t, a));
  EXPECT_TRUE(t.isfinite().all().item<bool>());
}

// --- masking ----------------------------------------------------------------------------------

// Each sequence's outputs alone (unpadded, batch 1), stacked.
void expect_padded_equals_alone(models::Model& model, const at::Tensor& padded, const std::vector<int64_t>& lengths,
                                const char* what) {
  SCOPED_TRACE(what);
  Tensors out = model.call_with_masks({padded}, {}, false, nullptr);
  for (size_t i = 0; i < lengths.size(); ++i) {
    at::Tensor alone = padded.narrow(0, i, 1).narrow(1, 0, lengths[i]);
    Tensors ref = model.call_with_masks({alone}, {}, false, nullptr);
    ASSERT_EQ(out.size(), ref.size());
    for (size_t k = 0; k < out.size(); ++k) {
      at::Tensor got = out[k].narrow(0, i, 1);
      if (got.dim() == 3) got = got.narrow(1, 0, lengths[i]);  // sequences: the valid steps
      EXPECT_TRUE(at::allclose(got, ref[k], 1e-5, 1e-6)) << "sequence " << i << ", output " << k << "\n"
                                                         << got << "\n"
                                                         << ref[k];
    }
  }
}

TEST(Masking, EmbeddingMaskZeroThroughSequentialToLSTM) {
  clear_session();
  auto model = models::Sequential(std::vector<LayerPtr>{layers::Embedding(10, 4, Json{{"mask_zero", true}}),
                                                        layers::LSTM(Json{{"units", 3}, {"return_sequences", true}}),
                                                        layers::Dense(2), layers::GRU(Json{{"units", 3}})});
  // Sequences of lengths 5, 5, 1, 3 (zeros pad the end).
  at::Tensor ids = at::tensor({3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 0, 0, 0, 0, 8, 9, 7, 0, 0}, at::kLong).reshape({4, 5});
  expect_padded_equals_alone(*model, ids, {5, 5, 1, 3}, "embedding -> lstm -> dense -> gru");
  // Without the mask the padded run differs (the test can fail).
  auto unmasked = models::Sequential(std::vector<LayerPtr>{layers::Embedding(10, 4), layers::LSTM(Json{{"units", 3}})});
  at::Tensor a = (*unmasked)(ids.narrow(0, 3, 1));
  at::Tensor b = (*unmasked)(ids.narrow(0, 3, 1).narrow(1, 0, 3));
  EXPECT_FALSE(at::allclose(a, b, 1e-5, 1e-6));
}

TEST(Masking, MaskingLayerThroughFunctionalToEveryRecurrentLayer) {
  clear_session();
  at::Tensor x = at::randn({3, 6, 4});
  const std::vector<int64_t> lengths = {6, 2, 4};
  for (size_t i = 0; i < lengths.size(); ++i) x[i].narrow(0, lengths[i], 6 - lengths[i]).fill_(-1.0);
  const Json bi = {{"class_name", "LSTM"}, {"config", {{"units", 3}, {"return_sequences", true}}}};
  for (const Json& spec :
       {Json{{"class_name", "LSTM"}, {"config", {{"units", 3}, {"return_state", true}}}},
        Json{{"class_name", "LSTM"}, {"config", {{"units", 3}, {"return_sequences", true}, {"go_backwards", true}}}},
        Json{{"class_name", "GRU"}, {"config", {{"units", 3}, {"go_backwards", true}, {"return_state", true}}}},
        Json{{"class_name", "GRU"}, {"config", {{"units", 3}, {"reset_after", false}, {"return_sequences", true}}}},
        Json{{"class_name", "SimpleRNN"}, {"config", {{"units", 3}, {"return_state", true}}}},
        Json{{"class_name", "Bidirectional"}, {"config", {{"layer", bi}, {"merge_mode", "sum"}}}},
        Json{{"class_name", "Bidirectional"},
             {"config", {{"layer", {{"class_name", "GRU"}, {"config", {{"units", 2}, {"return_state", true}}}}}}}}}) {
    auto in = layers::Input({kNone, 4});
    auto masked = (*layer_from_json(Json{{"class_name", "Masking"}, {"config", {{"mask_value", -1.0}}}}))(in);
    auto outs = (*layer_from_json(spec))(KerasTensors{masked});
    models::FunctionalImpl model(KerasTensors{in}, outs);
    const std::string what = spec.dump();
    if (spec["config"].value("go_backwards", false) && spec["config"].value("return_sequences", false)) {
      // Reversed outputs: only the final states line up; check the last output.
      Tensors out = model.call_with_masks({x}, {}, false, nullptr);
      for (size_t i = 0; i < lengths.size(); ++i) {
        Tensors ref = model.call_with_masks({x.narrow(0, i, 1).narrow(1, 0, lengths[i])}, {}, false, nullptr);
        EXPECT_TRUE(at::allclose(out[0].narrow(0, i, 1).select(1, 5), ref[0].select(1, lengths[i] - 1), 1e-5, 1e-6))
            << what << " sequence " << i;
      }
      continue;
    }
    expect_padded_equals_alone(model, x, lengths, what.c_str());
  }
}

TEST(Masking, MaskedStepsRepeatThePreviousOutput) {
  clear_session();
  auto rnn = layers::SimpleRNN(Json{{"units", 2}, {"return_sequences", true}});
  at::Tensor x = at::randn({1, 5, 3});
  at::Tensor mask = at::tensor({1, 0, 1, 0, 0}, at::kLong).to(at::kBool).unsqueeze(0);
  Tensors out_masks;
  at::Tensor y = rnn->call_with_masks({x}, {mask}, false, &out_masks)[0];
  EXPECT_TRUE(at::equal(y[0][1], y[0][0]));
  EXPECT_TRUE(at::equal(y[0][3], y[0][2]));
  EXPECT_TRUE(at::equal(y[0][4], y[0][2]));
  EXPECT_TRUE(at::equal(out_masks.at(0), mask));
  // Step 2 sees the state after step 0 only: same as the unmasked run on steps 0 and 2.
  at::Tensor two = (*rnn)(at::cat({x.narrow(1, 0, 1), x.narrow(1, 2, 1)}, 1));
  EXPECT_TRUE(at::allclose(y[0][2], two[0][1], 1e-6, 1e-6));
  auto zero = layers::SimpleRNN(Json{{"units", 2}, {"return_sequences", true}, {"zero_output_for_mask", true}});
  (*zero)(x);
  zero->set_weights(rnn->get_weights());
  at::Tensor z = zero->call_with_masks({x}, {mask}, false, nullptr)[0];
  EXPECT_TRUE(at::equal(z[0][1], at::zeros({2})));
  EXPECT_TRUE(at::equal(z[0][2], y[0][2]));
}

TEST(Masking, MasksMadeAndPassedByLayers) {
  clear_session();
  layers::EmbeddingImpl e(5, 2, Json{{"mask_zero", true}});
  Tensors m;
  e.call_with_masks({at::tensor({1, 0, 3}, at::kLong).unsqueeze(0)}, {}, false, &m);
  EXPECT_TRUE(at::equal(m.at(0), at::tensor({1, 0, 1}, at::kLong).to(at::kBool).unsqueeze(0)));
  EXPECT_EQ(e.get_config()["mask_zero"], true);
  layers::EmbeddingImpl plain(5, 2);
  plain.call_with_masks({at::tensor({1, 0, 3}, at::kLong)}, {}, false, &m);
  EXPECT_FALSE(m.at(0).defined());

  layers::MaskingImpl masking(Json{{"mask_value", 2.0}});
  at::Tensor x = at::tensor({2.0, 2.0, 1.0, 2.0, 0.0, 0.0}).reshape({1, 3, 2});
  at::Tensor y = masking.call_with_masks({x}, {}, false, &m)[0];
  EXPECT_TRUE(at::equal(m.at(0), at::tensor({0, 1, 1}, at::kLong).to(at::kBool).unsqueeze(0)));
  EXPECT_TRUE(at::equal(y, at::tensor({0.0, 0.0, 1.0, 2.0, 0.0, 0.0}).reshape({1, 3, 2})));

  // Dense passes a mask on (Keras: supports_masking); a layer that does not stops it.
  layers::DenseImpl d(2);
  at::Tensor mask = at::ones({1, 3}, at::kBool);
  d.call_with_masks({x}, {mask}, false, &m);
  EXPECT_TRUE(at::equal(m.at(0), mask));
  auto flat = layer_from_json(Json{{"class_name", "Flatten"}, {"config", Json::object()}});
  flat->call_with_masks({x}, {mask}, false, &m);
  EXPECT_FALSE(m.at(0).defined());
  // A model hands its output's mask out.
  models::SequentialImpl model(std::vector<LayerPtr>{layers::Masking(Json{{"mask_value", 2.0}}),
                                                     layers::LSTM(Json{{"units", 2}, {"return_sequences", true}})});
  model.call_with_masks({x}, {}, false, &m);
  EXPECT_TRUE(at::equal(m.at(0), at::tensor({0, 1, 1}, at::kLong).to(at::kBool).unsqueeze(0)));
}

TEST(Recurrent, ModelSavesAndLoadsWithMasksAndWrappers) {
  clear_session();
  const Json lstm = {{"class_name", "LSTM"}, {"config", {{"units", 3}, {"return_sequences", true}}}};
  auto model = models::Sequential(std::vector<LayerPtr>{
      layers::Embedding(10, 4, Json{{"mask_zero", true}}),
      layer_from_json(Json{{"class_name", "Bidirectional"}, {"config", {{"layer", lstm}}}}),
      layer_from_json(Json{{"class_name", "TimeDistributed"},
                           {"config", {{"layer", {{"class_name", "Dense"}, {"config", {{"units", 2}}}}}}}}),
      layer_from_json(Json{{"class_name", "GRU"}, {"config", {{"units", 2}, {"reset_after", false}}}})});
  at::Tensor ids = at::tensor({3, 1, 4, 0, 0, 9, 2, 6, 5, 3}, at::kLong).reshape({2, 5});
  at::Tensor before = (*model)(ids);
  TempDir dir;
  model->save(dir.path() + "/m");
  ModelPtr loaded = load_model(dir.path() + "/m");
  EXPECT_TRUE(at::equal((*loaded)(ids), before));
  EXPECT_EQ(loaded->weights()[1]->path(), "sequential/bidirectional/forward_lstm/lstm_cell/kernel");
  // The loaded model still masks: the padded first sequence equals its unpadded self.
  EXPECT_TRUE(at::allclose((*loaded)(ids.narrow(0, 0, 1).narrow(1, 0, 3)), before.narrow(0, 0, 1), 1e-5, 1e-6));
}

}  // namespace
}  // namespace kiln
