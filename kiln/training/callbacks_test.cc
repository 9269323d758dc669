#include "kiln/training/callbacks.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <regex>
#include <sstream>
#include <tuple>

#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/optimizers/optimizer.h"
#include "kiln/saving/safetensors.h"
#include "kiln/testing/testing.h"
#include "kiln/training/path_format.h"
#include "kiln/training/tfevents.h"
#include "kiln/training/train_state.h"
#include "kiln/training/training_test_util.h"
#include "tensorflow/core/util/event.pb.h"

namespace kiln {
namespace {

using namespace testing_training;

// Overwrites logs[key] with a scripted value per epoch; put it before the
// callback under test (on_epoch_end logs are shared, as in Keras).
CallbackPtr script(const std::string& key, std::vector<double> values) {
  auto cb = callbacks::LambdaCallback();
  cb->on_epoch_end_fn = [key, values](int epoch, Logs& logs) { logs[key] = values.at(epoch); };
  return cb;
}

// Weights at the end of each epoch.
std::shared_ptr<callbacks::LambdaCallbackImpl> weight_recorder(models::Model* model, std::vector<Tensors>* out) {
  auto cb = callbacks::LambdaCallback();
  cb->on_epoch_end_fn = [model, out](int, Logs&) { out->push_back(model->get_weights()); };
  return cb;
}

// --- EarlyStopping -------------------------------------------------------------

TEST(EarlyStopping, StopsAfterPatienceAndRestoresTheBestWeights) {
  set_random_seed(1);
  auto model = make_model(optimizer("SGD", 0.1));
  std::vector<Tensors> weights;
  auto es = callbacks::EarlyStopping({.patience = 2, .restore_best_weights = true});
  FitArgs a = quiet(blobs(32), 20);
  a.callbacks = {script("val_loss", {1.0, 0.8, 0.9, 0.85, 0.95, 0.7, 0.6}), es, weight_recorder(model.get(), &weights)};
  History h = model->fit(a);
  EXPECT_EQ(h.history["loss"].size(), 4u);  // epochs 0..3; stops at 3 (two epochs without beating 0.8)
  EXPECT_EQ(es->stopped_epoch(), 3);
  EXPECT_EQ(es->best_epoch(), 1);
  EXPECT_EQ(*es->best(), 0.8);
  ASSERT_EQ(weights.size(), 4u);
  EXPECT_FALSE(same_weights(weights[1], weights[3]));
  EXPECT_TRUE(same_weights(model->get_weights(), weights[1]));
}

TEST(EarlyStopping, MinDeltaBaselineStartFromEpochAndModes) {
  auto epochs_run = [](callbacks::EarlyStoppingOptions o, const std::string& key, std::vector<double> seq) {
    auto model = make_model(optimizer("SGD", 0.1));
    FitArgs a = quiet(blobs(16), (int)seq.size());
    a.callbacks = {script(key, seq), callbacks::EarlyStopping(o)};
    return (int)model->fit(a).history["loss"].size();
  };
  std::vector<double> rising{1.0, 1.1, 1.2, 1.3, 1.4, 1.5};
  EXPECT_EQ(epochs_run({.patience = 2}, "val_loss", rising), 3);
  EXPECT_EQ(epochs_run({.patience = 2, .baseline = 0.5}, "val_loss", rising), 2);
  EXPECT_EQ(epochs_run({.patience = 2, .start_from_epoch = 2}, "val_loss", rising), 5);
  // Improvements smaller than min_delta do not count.
  std::vector<double> creeping{1.0, 0.99, 0.98, 0.97, 0.96, 0.95};
  EXPECT_EQ(epochs_run({.min_delta = 0.05, .patience = 1}, "val_loss", creeping), 2);
  EXPECT_EQ(epochs_run({.patience = 1}, "val_loss", creeping), 6);
  // "auto" maximises accuracy (a compiled metric that says higher is better).
  std::vector<double> acc{0.5, 0.6, 0.7, 0.65, 0.6, 0.55};
  EXPECT_EQ(epochs_run({.monitor = "val_accuracy", .patience = 2}, "val_accuracy", acc), 5);
  EXPECT_EQ(epochs_run({.monitor = "val_accuracy", .patience = 2, .mode = "min"}, "val_accuracy", acc), 3);
  EXPECT_THROW(callbacks::EarlyStoppingImpl({.mode = "up"}), ValueError);
}

// --- ModelCheckpoint -----------------------------------------------------------

TEST(ModelCheckpoint, SaveBestOnlyWritesOnImprovementWithFormattedNames) {
  TempDir tmp;
  set_random_seed(2);
  auto model = make_model(optimizer("SGD", 0.1));
  auto ckpt = callbacks::ModelCheckpoint(tmp.path() + "/m-{epoch:02d}-{val_loss:.2f}",
                                         callbacks::ModelCheckpointOptions{.save_best_only = true});
  FitArgs a = quiet(blobs(32), 5);
  a.callbacks = {script("val_loss", {0.9, 0.95, 0.456, 0.6, 0.456}), ckpt};
  model->fit(a);
  EXPECT_EQ(list_directory(tmp.path()), (std::vector<std::string>{"m-01-0.90", "m-03-0.46"}));
  EXPECT_TRUE(path_exists(tmp.path() + "/m-03-0.46/model.json"));
  EXPECT_TRUE(path_exists(tmp.path() + "/m-03-0.46/weights.safetensors"));
  EXPECT_EQ(*ckpt->best(), 0.456);
}

TEST(ModelCheckpoint, WeightsOnlyEveryEpochAndEveryNBatches) {
  TempDir tmp;
  set_random_seed(3);
  auto model = make_model(optimizer("SGD", 0.1));
  std::vector<Tensors> weights;
  FitArgs a = quiet(blobs(64), 3, 16);  // 4 batches per epoch
  a.callbacks = {
      callbacks::ModelCheckpoint(tmp.path() + "/w-{epoch}.safetensors",
                                 callbacks::ModelCheckpointOptions{.save_weights_only = true}),
      callbacks::ModelCheckpoint(tmp.path() + "/b/e{epoch}-b{batch}.safetensors",
                                 callbacks::ModelCheckpointOptions{.save_weights_only = true, .save_freq = 3}),
      weight_recorder(model.get(), &weights)};
  model->fit(a);
  EXPECT_EQ(list_directory(tmp.path() + "/b"), (std::vector<std::string>{"e1-b3.safetensors", "e2-b2.safetensors",
                                                                         "e3-b1.safetensors", "e3-b4.safetensors"}));
  // Epoch 2's file holds the weights at the end of epoch 2.
  auto saved = load_safetensors(tmp.path() + "/w-2.safetensors");
  auto vars = model->weights();
  ASSERT_EQ(saved.size(), vars.size());
  for (size_t i = 0; i < vars.size(); ++i) {
    EXPECT_EQ(saved[i].first, vars[i]->path());
    EXPECT_TRUE(at::equal(saved[i].second, weights[1][i]));
  }
  model->load_weights(tmp.path() + "/w-1.safetensors");
  EXPECT_TRUE(same_weights(model->get_weights(), weights[0]));

  EXPECT_THROW(callbacks::ModelCheckpointImpl(tmp.path() + "/w.bin", {.save_weights_only = true}), ValueError);
  EXPECT_THROW(callbacks::ModelCheckpointImpl(tmp.path() + "/w", {.save_freq = 0}), ValueError);
}

// --- ReduceLROnPlateau ---------------------------------------------------------

TEST(ReduceLROnPlateau, LowersTheRateAfterPatienceWithCooldownAndFloor) {
  auto model = make_model(optimizer("SGD", 0.1));
  FitArgs a = quiet(blobs(16), 6);
  a.callbacks = {script("val_loss", std::vector<double>(6, 1.0)),
                 callbacks::ReduceLROnPlateau({.factor = 0.5, .patience = 2, .cooldown = 1})};
  History h = model->fit(a);
  ASSERT_EQ(h.history["learning_rate"].size(), 6u);
  std::vector<double> want{0.1, 0.1, 0.1, 0.05, 0.05, 0.025};
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(h.history["learning_rate"][i], want[i], 1e-12) << i;
  EXPECT_NEAR(model->train_state().optimizer().learning_rate(), 0.025, 1e-12);

  auto floored = make_model(optimizer("SGD", 0.1));
  a.callbacks = {script("val_loss", std::vector<double>(6, 1.0)),
                 callbacks::ReduceLROnPlateau({.factor = 0.1, .patience = 1, .min_lr = 0.004})};
  floored->fit(a);
  EXPECT_NEAR(floored->train_state().optimizer().learning_rate(), 0.004, 1e-12);
  EXPECT_THROW(callbacks::ReduceLROnPlateauImpl({.factor = 1.0}), ValueError);
}

// A schedule's rate cannot be set: fit() refuses the pair before the first
// step (one error naming both and the fix), not at the first plateau.
TEST(ReduceLROnPlateau, AScheduledLearningRateIsRefusedBeforeTheFirstStep) {
  auto model = make_model(Optimizer::from_json(Json::parse(R"({"class_name": "SGD", "config": {"learning_rate":
      {"class_name": "ExponentialDecay", "config": {"initial_learning_rate": 0.1, "decay_steps": 2,
                                                    "decay_rate": 0.5}}}})")));
  FitArgs a = quiet(blobs(16), 3);
  a.callbacks = {script("val_loss", std::vector<double>(3, 1.0)), callbacks::ReduceLROnPlateau({.patience = 1})};
  std::string error;
  try {
    model->fit(a);
  } catch (const ValueError& e) {
    error = e.what();
  }
  for (const char* m : {"ReduceLROnPlateau", "ExponentialDecay", "constant learning_rate", "drop the callback"})
    EXPECT_NE(error.find(m), std::string::npos) << m << " not in: " << error;
  EXPECT_EQ(model->train_state().optimizer().iterations(), 0);
}

// --- CSVLogger -----------------------------------------------------------------

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream is(text);
  for (std::string l; std::getline(is, l);) out.push_back(l);
  return out;
}

TEST(CSVLogger, WritesKerasColumnsAndAppends) {
  TempDir tmp;
  set_random_seed(4);
  const std::string file = tmp.path() + "/log.csv";
  auto model = make_model(optimizer("SGD", 0.1));
  Problem p = blobs(32);
  FitArgs a = quiet(p, 3);
  a.validation_x = {p.x};
  a.validation_y = {p.y};
  a.callbacks = {callbacks::CSVLogger(file)};
  History h = model->fit(a);
  auto lines = lines_of(read_file(file));
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0], "epoch,accuracy,loss,val_accuracy,val_loss");
  for (int e = 0; e < 3; ++e) {
    std::vector<std::string> cols;
    std::istringstream is(lines[e + 1]);
    for (std::string c; std::getline(is, c, ',');) cols.push_back(c);
    ASSERT_EQ(cols.size(), 5u);
    EXPECT_EQ(cols[0], std::to_string(e));
    // Shortest round-trip text: parses back to the exact value.
    EXPECT_EQ(std::strtod(cols[2].c_str(), nullptr), h.history["loss"][e]);
    EXPECT_EQ(std::strtod(cols[4].c_str(), nullptr), h.history["val_loss"][e]);
  }
  a.epochs = 2;
  a.callbacks = {callbacks::CSVLogger({.filename = file, .append = true})};
  model->fit(a);
  lines = lines_of(read_file(file));
  ASSERT_EQ(lines.size(), 6u);
  EXPECT_EQ(lines[4].substr(0, 2), "0,");

  // validation_freq 2: the first epoch has no val_ values; columns still exist.
  a.callbacks = {callbacks::CSVLogger({.filename = file, .separator = ";"})};
  a.validation_freq = 2;
  model->fit(a);
  lines = lines_of(read_file(file));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "epoch;accuracy;loss;val_accuracy;val_loss");
  EXPECT_EQ(lines[1].substr(lines[1].size() - 6), ";NA;NA");
}

// --- TensorBoard ---------------------------------------------------------------

// An independent reader: bitwise CRC-32C, TFRecord framing, protobuf decode.
uint32_t crc32c_bitwise(const std::string& s) {
  uint32_t crc = 0xffffffffu;
  for (unsigned char c : s) {
    crc ^= c;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
  }
  return ~crc;
}
uint32_t masked(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }

uint64_t le(const std::string& s, size_t pos, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= (uint64_t)(unsigned char)s[pos + i] << (8 * i);
  return v;
}

struct ParsedEvent {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::string tag;
  float value = 0;
  bool has_value = false;
};

uint64_t varint(const std::string& s, size_t& pos) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    unsigned char b = s.at(pos++);
    v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
}

// Calls fn(field, wire_type, payload_pos, payload_len_or_value) per field.
template <class F>
void fields(const std::string& s, F fn) {
  size_t pos = 0;
  while (pos < s.size()) {
    uint64_t key = varint(s, pos);
    int field = (int)(key >> 3), wt = (int)(key & 7);
    if (wt == 0)
      fn(field, wt, std::string(), varint(s, pos));
    else if (wt == 1)
      fn(field, wt, s.substr(pos, 8), 0), pos += 8;
    else if (wt == 5)
      fn(field, wt, s.substr(pos, 4), 0), pos += 4;
    else if (wt == 2) {
      uint64_t n = varint(s, pos);
      fn(field, wt, s.substr(pos, n), n);
      pos += n;
    } else {
      throw std::runtime_error("unexpected wire type");
    }
  }
}

std::vector<ParsedEvent> read_events(const std::string& path) {
  std::string data = read_file(path);
  std::vector<ParsedEvent> out;
  size_t pos = 0;
  while (pos < data.size()) {
    EXPECT_LE(pos + 12, data.size());
    std::string len_bytes = data.substr(pos, 8);
    uint64_t len = le(data, pos, 8);
    EXPECT_EQ(le(data, pos + 8, 4), masked(crc32c_bitwise(len_bytes))) << "length CRC";
    std::string rec = data.substr(pos + 12, len);
    EXPECT_EQ(le(data, pos + 12 + len, 4), masked(crc32c_bitwise(rec))) << "data CRC";
    pos += 12 + len + 4;
    ParsedEvent ev;
    fields(rec, [&](int f, int wt, const std::string& payload, uint64_t v) {
      if (f == 1 && wt == 1)
        std::memcpy(&ev.wall_time, payload.data(), 8);
      else if (f == 2 && wt == 0)
        ev.step = (int64_t)v;
      else if (f == 3 && wt == 2)
        ev.file_version = payload;
      else if (f == 5 && wt == 2) {
        fields(payload, [&](int sf, int swt, const std::string& value_msg, uint64_t) {
          ASSERT_EQ(sf, 1);
          ASSERT_EQ(swt, 2);
          fields(value_msg, [&](int vf, int vwt, const std::string& p2, uint64_t) {
            if (vf == 1 && vwt == 2) ev.tag = p2;
            if (vf == 2 && vwt == 5) std::memcpy(&ev.value, p2.data(), 4), ev.has_value = true;
          });
        });
      }
    });
    out.push_back(ev);
  }
  EXPECT_EQ(pos, data.size());
  return out;
}

std::string only_event_file(const std::string& dir) {
  auto names = list_directory(dir);
  EXPECT_EQ(names.size(), 1u) << dir;
  EXPECT_EQ(names.at(0).rfind("events.out.tfevents.", 0), 0u) << names.at(0);
  return join_path(dir, names.at(0));
}

TEST(TensorBoard, Crc32cKnownAnswer) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c_bitwise("123456789"), 0xE3069283u);
}

TEST(TensorBoard, WritesEventFilesTensorBoardCanRead) {
  TempDir tmp;
  set_random_seed(5);
  auto model = make_model(optimizer("SGD", 0.1));
  Problem p = blobs(32);
  FitArgs a = quiet(p, 3);
  a.validation_x = {p.x};
  a.validation_y = {p.y};
  a.callbacks = {callbacks::TensorBoard(tmp.path() + "/logs")};
  History h = model->fit(a);

  auto train = read_events(only_event_file(tmp.path() + "/logs/train"));
  ASSERT_FALSE(train.empty());
  EXPECT_EQ(train[0].file_version, "brain.Event:2");
  EXPECT_GT(train[0].wall_time, 1.6e9);
  std::map<std::string, std::vector<std::pair<int64_t, float>>> scalars;
  for (size_t i = 1; i < train.size(); ++i) {
    ASSERT_TRUE(train[i].has_value);
    scalars[train[i].tag].emplace_back(train[i].step, train[i].value);
  }
  for (const char* tag : {"epoch_loss", "epoch_accuracy", "epoch_learning_rate"})
    ASSERT_EQ(scalars[tag].size(), 3u) << tag;
  for (int e = 0; e < 3; ++e) {
    EXPECT_EQ(scalars["epoch_loss"][e].first, e);
    EXPECT_EQ(scalars["epoch_loss"][e].second, (float)h.history["loss"][e]);
    EXPECT_EQ(scalars["epoch_accuracy"][e].second, (float)h.history["accuracy"][e]);
    EXPECT_FLOAT_EQ(scalars["epoch_learning_rate"][e].second, 0.1f);
  }

  auto val = read_events(only_event_file(tmp.path() + "/logs/validation"));
  std::vector<float> val_loss;
  int evaluations = 0;
  for (auto& ev : val) {
    if (ev.tag == "epoch_loss") val_loss.push_back(ev.value);
    if (ev.tag == "evaluation_loss_vs_iterations") ++evaluations;
  }
  ASSERT_EQ(val_loss.size(), 3u);
  for (int e = 0; e < 3; ++e) EXPECT_EQ(val_loss[e], (float)h.history["val_loss"][e]);
  EXPECT_EQ(evaluations, 3);
}

// The same records through the generated tensorflow.Event message, as
// TensorBoard parses them.
std::vector<tensorflow::Event> read_event_protos(const std::string& path) {
  std::string data = read_file(path);
  std::vector<tensorflow::Event> out;
  size_t pos = 0;
  while (pos + 12 <= data.size()) {
    uint64_t len = le(data, pos, 8);
    EXPECT_EQ(le(data, pos + 12 + len, 4), masked(crc32c_bitwise(data.substr(pos + 12, len)))) << "data CRC";
    tensorflow::Event ev;
    EXPECT_TRUE(ev.ParseFromString(data.substr(pos + 12, len))) << "record at byte " << pos;
    out.push_back(ev);
    pos += 12 + len + 4;
  }
  EXPECT_EQ(pos, data.size());
  return out;
}

TEST(TensorBoard, RecordsParseAsTensorflowEvents) {
  TempDir tmp;
  std::string path;
  {
    EventFileWriter w(tmp.path() + "/logs");
    path = w.path();
    w.add_scalar("epoch_loss", 0.25, 0);
    w.add_scalar("epoch_loss", -1.5, 7);
    w.add_scalar("batch_accuracy", 0.75, int64_t{1} << 40);
    // A plugin summary with a tensor value, as the hparams writer builds it.
    tensorflow::Event ev;
    ev.set_wall_time(1.7e9);
    ev.set_step(3);
    auto* v = ev.mutable_summary()->add_value();
    v->set_tag("t");
    v->mutable_metadata()->mutable_plugin_data()->set_plugin_name("hparams");
    v->mutable_tensor()->set_dtype(tensorflow::DT_FLOAT);
    v->mutable_tensor()->add_float_val(2.5f);
    w.add_event(ev.SerializeAsString());
    w.flush();
  }
  auto events = read_event_protos(path);
  ASSERT_EQ(events.size(), 5u);
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_GT(events[0].wall_time(), 1.6e9);
  const std::vector<std::tuple<std::string, float, int64_t>> want = {
      {"epoch_loss", 0.25f, 0}, {"epoch_loss", -1.5f, 7}, {"batch_accuracy", 0.75f, int64_t{1} << 40}};
  for (size_t i = 0; i < want.size(); ++i) {
    const auto& ev = events[i + 1];
    ASSERT_TRUE(ev.has_summary()) << i;
    ASSERT_EQ(ev.summary().value_size(), 1) << i;
    EXPECT_EQ(ev.summary().value(0).tag(), std::get<0>(want[i]));
    EXPECT_EQ(ev.summary().value(0).simple_value(), std::get<1>(want[i]));
    EXPECT_EQ(ev.step(), std::get<2>(want[i]));
    EXPECT_GE(ev.wall_time(), events[0].wall_time());
  }
  const auto& t = events[4].summary().value(0);
  EXPECT_EQ(events[4].step(), 3);
  EXPECT_EQ(events[4].wall_time(), 1.7e9);
  EXPECT_EQ(t.metadata().plugin_data().plugin_name(), "hparams");
  ASSERT_EQ(t.tensor().float_val_size(), 1);
  EXPECT_EQ(t.tensor().float_val(0), 2.5f);
  // The independent decoder above reads the same scalars.
  auto plain = read_events(path);
  ASSERT_EQ(plain.size(), 5u);
  EXPECT_EQ(plain[2].step, 7);
  EXPECT_EQ(plain[2].value, -1.5f);
}

// --- progress output -------------------------------------------------------------

TEST(ProgbarLogger, OneLinePerEpochInKerasForm) {
  set_random_seed(6);
  auto model = make_model(optimizer("SGD", 0.1));
  Problem p = blobs(64);
  std::ostringstream os;
  FitArgs a = quiet(p, 2);
  a.validation_x = {p.x};
  a.validation_y = {p.y};
  a.callbacks = {callbacks::ProgbarLogger(2, &os)};
  model->fit(a);
  auto lines = lines_of(os.str());
  ASSERT_EQ(lines.size(), 4u) << os.str();
  EXPECT_EQ(lines[0], "Epoch 1/2");
  EXPECT_EQ(lines[2], "Epoch 2/2");
  const std::regex keras(
      R"(^4/4 - \d+s - \d+(s|ms|us)/step - loss: \d+\.\d{4} - accuracy: \d\.\d{4} - val_loss: \d+\.\d{4} - val_accuracy: \d\.\d{4}$)");
  EXPECT_TRUE(std::regex_match(lines[1], keras)) << lines[1];
  EXPECT_TRUE(std::regex_match(lines[3], keras)) << lines[3];
}

TEST(ProgbarLogger, VerboseTwoOnStdoutAndBarWhenVerboseOne) {
  set_random_seed(7);
  auto model = make_model(optimizer("SGD", 0.1));
  Problem p = blobs(40);
  FitArgs a = quiet(p, 1, 10);
  a.verbose = 2;
  ::testing::internal::CaptureStdout();
  model->fit(a);
  std::string out = ::testing::internal::GetCapturedStdout();
  // One epoch: no "Epoch 1/1" header (Keras prints it only when epochs > 1).
  EXPECT_TRUE(
      std::regex_match(out, std::regex(R"(4/4 - \d+s - \d+(s|ms|us)/step - loss: \d+\.\d{4} - accuracy: \d\.\d{4}\n)")))
      << out;

  std::ostringstream os;
  a.verbose = 0;
  a.callbacks = {callbacks::ProgbarLogger(1, &os, /*dynamic=*/0)};
  model->fit(a);
  auto lines = lines_of(os.str());
  ASSERT_GE(lines.size(), 1u);
  EXPECT_TRUE(std::regex_match(
      lines.back(),
      std::regex(R"(4/4 \[====================\] \d+s \d+(s|ms|us)/step - loss: \d+\.\d{4} - accuracy: \d\.\d{4})")))
      << lines.back();

  ::testing::internal::CaptureStdout();
  model->evaluate({.x = {p.x}, .y = {p.y}, .batch_size = 20, .verbose = 2});
  out = ::testing::internal::GetCapturedStdout();
  EXPECT_TRUE(
      std::regex_match(out, std::regex(R"(2/2 - \d+s - \d+(s|ms|us)/step - loss: \d+\.\d{4} - accuracy: \d\.\d{4}\n)")))
      << out;
}

TEST(Progbar, FormatsValuesAndTimesAsKeras) {
  EXPECT_EQ(Progbar::format_value(0.51234), "0.5123");
  EXPECT_EQ(Progbar::format_value(0.0001234), "1.2340e-04");
  EXPECT_EQ(Progbar::format_value(-2.5), "-2.5000");
  EXPECT_EQ(Progbar::format_time(0.004, "step"), " 4ms/step");
  EXPECT_EQ(Progbar::format_time(2.0, "step"), " 2s/step");
  EXPECT_EQ(Progbar::format_time(0.00002, "step"), " 20us/step");
}

// --- callback order, LambdaCallback, TerminateOnNaN ----------------------------------

class Recorder : public callbacks::Callback {
 public:
  std::vector<std::string> calls;
  void on_train_begin(const Logs&) override { calls.push_back("train_begin"); }
  void on_train_end(const Logs&) override { calls.push_back("train_end"); }
  void on_epoch_begin(int e, const Logs&) override { calls.push_back("epoch_begin " + std::to_string(e)); }
  void on_epoch_end(int e, Logs& l) override {
    calls.push_back("epoch_end " + std::to_string(e) + (l.count("val_loss") ? " val" : ""));
  }
  void on_train_batch_begin(int64_t b, const Logs&) override { calls.push_back("batch_begin " + std::to_string(b)); }
  void on_train_batch_end(int64_t b, const Logs& l) override {
    calls.push_back("batch_end " + std::to_string(b) + (l.count("loss") && l.count("accuracy") ? " logs" : ""));
  }
  void on_test_begin(const Logs&) override { calls.push_back("test_begin"); }
  void on_test_batch_end(int64_t b, const Logs&) override { calls.push_back("test_batch_end " + std::to_string(b)); }
  void on_test_end(const Logs&) override { calls.push_back("test_end"); }
};

TEST(Callbacks, HooksRunInKerasOrderWithParams) {
  auto model = make_model(optimizer("SGD", 0.1));
  Problem p = blobs(20);
  auto rec = std::make_shared<Recorder>();
  FitArgs a = quiet(p, 2, 10);
  a.validation_x = {p.x};
  a.validation_y = {p.y};
  a.batch_size = 10;
  a.callbacks = {rec};
  model->fit(a);
  std::vector<std::string> want{"train_begin"};
  for (int e = 0; e < 2; ++e) {
    for (auto s : {"epoch_begin " + std::to_string(e), std::string("batch_begin 0"), std::string("batch_end 0 logs"),
                   std::string("batch_begin 1"), std::string("batch_end 1 logs"), std::string("test_begin"),
                   std::string("test_batch_end 0"), std::string("test_batch_end 1"), std::string("test_end"),
                   "epoch_end " + std::to_string(e) + " val"})
      want.push_back(s);
  }
  want.push_back("train_end");
  EXPECT_EQ(rec->calls, want);
  EXPECT_EQ(rec->params()["epochs"], 2);
  EXPECT_EQ(rec->params()["steps"], 2);
  EXPECT_EQ(rec->params()["verbose"], 0);
}

TEST(Callbacks, AnExceptionEndsFitWithoutTrainEnd) {
  auto model = make_model(optimizer("SGD", 0.1));
  auto rec = std::make_shared<Recorder>();
  auto boom = callbacks::LambdaCallback();
  boom->on_train_batch_end_fn = [](int64_t b, const Logs&) {
    if (b == 1) throw std::runtime_error("interrupted");
  };
  FitArgs a = quiet(blobs(40), 3, 10);
  a.callbacks = {rec, boom};
  EXPECT_THROW(model->fit(a), std::runtime_error);
  EXPECT_EQ(rec->calls.back(), "batch_end 1 logs");
  EXPECT_FALSE(model->train_state().progress().in_fit);
}

TEST(Callbacks, TerminateOnNaNStopsAtTheBatch) {
  auto model = make_model(optimizer("SGD", 0.1));
  auto& pl = model->train_state().pipeline();
  auto inner = pl.compute_loss;
  pl.compute_loss = [inner](TrainState& ts, StepData& s) {
    inner(ts, s);
    s.loss = s.loss * std::nan("");
  };
  int batches = 0;
  auto count = callbacks::LambdaCallback();
  count->on_train_batch_end_fn = [&](int64_t, const Logs&) { ++batches; };
  FitArgs a = quiet(blobs(64), 3, 16);
  a.callbacks = {count, callbacks::TerminateOnNaN()};
  ::testing::internal::CaptureStdout();
  History h = model->fit(a);
  ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(batches, 1);
  EXPECT_EQ(h.history["loss"].size(), 1u);
}

// --- python_format ---------------------------------------------------------------

// --- callback state (exact resume) ----------------------------------------------

class Counter : public callbacks::Callback {
 public:
  int seen = 0;
  void on_epoch_end(int, Logs&) override { ++seen; }
  Json get_state() const override { return Json{{"seen", seen}}; }
  void set_state(const Json& s) override { seen = s.at("seen").get<int>(); }
  std::string state_name() const override { return "Counter"; }
};

TEST(CallbackState, ListRoundTripsEveryCallbacksStateAndWarnsOnAMismatch) {
  auto es = callbacks::EarlyStopping({.monitor = "loss", .restore_best_weights = true});
  es->set_state(Json{{"wait", 2}, {"stopped_epoch", 0}, {"best_epoch", 1}, {"best", "inf"}});
  es->set_state_tensors({{"best_weights/000000", at::arange(3.0)}});
  auto counter = std::make_shared<Counter>();
  counter->seen = 7;
  auto plateau = callbacks::ReduceLROnPlateau();
  plateau->set_state(Json{{"best", 0.25}, {"wait", 3}, {"cooldown_counter", 1}});
  auto tb = callbacks::TensorBoard("unused");
  tb->set_state(Json{{"global_batch", 41}});
  callbacks::CallbackList saved({es, counter, plateau, tb}, false, false, nullptr, Json::object());
  callbacks::CallbackList::States st = saved.get_states();
  // Through JSON text, as a checkpoint stores it.
  st.json = Json::parse(st.json.dump());

  auto es2 = callbacks::EarlyStopping({.monitor = "loss", .restore_best_weights = true});
  auto counter2 = std::make_shared<Counter>();
  auto plateau2 = callbacks::ReduceLROnPlateau();
  auto tb2 = callbacks::TensorBoard("unused");
  callbacks::CallbackList restored({es2, counter2, plateau2, tb2}, false, false, nullptr, Json::object());
  restored.set_states(st);
  EXPECT_EQ(es2->wait(), 2);
  EXPECT_EQ(es2->best_epoch(), 1);
  EXPECT_TRUE(es2->best() && std::isinf(*es2->best()));
  auto t = es2->get_state_tensors();
  ASSERT_EQ(t.size(), 1u);
  EXPECT_TRUE(at::equal(t.begin()->second, at::arange(3.0)));
  EXPECT_EQ(counter2->seen, 7);
  EXPECT_EQ(plateau2->best(), 0.25);
  EXPECT_EQ(plateau2->wait(), 3);
  EXPECT_EQ(tb2->get_state()["global_batch"], 41);

  // Another program's callbacks: warned about, left fresh.
  auto counter3 = std::make_shared<Counter>();
  callbacks::CallbackList other({counter3}, false, false, nullptr, Json::object());
  ::testing::internal::CaptureStderr();
  other.set_states(st);
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("EarlyStopping"), std::string::npos) << err;
  EXPECT_EQ(counter3->seen, 0);
}

TEST(CallbackState, StateDoublesKeepInfinitiesAndEveryBit) {
  for (double v :
       {0.1, -1.0 / 3, 1e-300, std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()})
    EXPECT_EQ(state_double(Json::parse(state_double(v).dump())), v);
  EXPECT_TRUE(std::isnan(state_double(Json::parse(state_double(std::nan("")).dump()))));
  EXPECT_THROW(state_double(Json("big")), FormatError);
}

TEST(LearningRateScheduler, SetsTheRateEachEpochAndLogsIt) {
  set_random_seed(4);
  Problem p = blobs(32);
  auto model = make_model(optimizer("SGD", 0.1));
  std::vector<std::pair<int, double>> calls;
  FitArgs a = quiet(p, 3);
  a.callbacks = {callbacks::LearningRateScheduler([&](int epoch, double lr) {
    calls.emplace_back(epoch, lr);
    return lr * 0.5;
  })};
  History h = model->fit(a);
  EXPECT_EQ(calls, (std::vector<std::pair<int, double>>{{0, 0.1}, {1, 0.05}, {2, 0.025}}));
  EXPECT_EQ(h.history["learning_rate"], (std::vector<double>{0.05, 0.025, 0.0125}));
  a.callbacks = {callbacks::LearningRateScheduler([](int, double) { return -1.0; })};
  EXPECT_THROW(model->fit(a), ValueError);
  EXPECT_THROW(callbacks::LearningRateSchedulerImpl(nullptr), ValueError);
}

TEST(PathFormat, PythonFormatSpecs) {
  std::map<std::string, FormatValue> v{{"epoch", int64_t{3}}, {"val_loss", 0.4567}, {"tiny", 1e-5}, {"neg", -1.5}};
  EXPECT_EQ(python_format("m-{epoch:02d}-{val_loss:.2f}", v), "m-03-0.46");
  EXPECT_EQ(python_format("{epoch}/{val_loss}", v), "3/0.4567");
  EXPECT_EQ(python_format("{{epoch}}-{epoch:>4}|{epoch:<3}|{epoch:^5}|", v), "{epoch}-   3|3  |  3  |");
  EXPECT_EQ(python_format("{epoch:.3f} {val_loss:.1e} {tiny} {neg:+.1f} {val_loss:.1%}", v),
            "3.000 4.6e-01 1e-05 -1.5 45.7%");
  EXPECT_EQ(python_format("{epoch:+05d} {neg:08.3f}", v), "+0003 -001.500");
  EXPECT_THROW(python_format("{val_loss:d}", v), ValueError);
  EXPECT_THROW(python_format("{missing}", v), ValueError);
  EXPECT_THROW(python_format("{epoch", v), ValueError);
  EXPECT_THROW(python_format("epoch}", v), ValueError);
  try {
    python_format("{val_acc}", v);
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("val_loss"), std::string::npos) << e.what();
  }
  EXPECT_EQ(python_float_repr(0.1), "0.1");
  EXPECT_EQ(python_float_repr(123.0), "123.0");
  EXPECT_EQ(python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(python_float_repr(1e16), "1e+16");
  EXPECT_EQ(python_float_repr(1.5e-7), "1.5e-07");
  EXPECT_EQ(python_float_repr(-2.0), "-2.0");
  EXPECT_EQ(python_float_repr(1.0 / 3), "0.3333333333333333");
}

}  // namespace
}  // namespace kiln
