// String inputs (and outputs) end to end: a model whose input is a string
// tensor (InputLayer dtype "string") served over TF Serving REST (rows,
// columnar, b64), KServe v2 REST (BYTES), TF Serving gRPC (DT_STRING) and
// KServe gRPC (bytes_contents and raw_input_contents), with batching of
// different widths, warmup, metadata, wrong-dtype refusals, `kiln predict
// --grpc` and batch prediction.
//
// The model is a stand-in until the string layers exist: StringLengthForTest
// (each string's byte length as a float) then Dense(1) with kernel 2 and
// bias 1, so "hi" predicts 5. Swap it for a TextVectorization classifier by
// changing save_text_model() and expected(). String outputs come from a
// test-only servable platform that upper-cases its input.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <future>
#include <sstream>

#include "inference/grpc_predict_v2.grpc.pb.h"
#include "kiln/batch/batch_predict.h"
#include "kiln/core/io.h"
#include "kiln/core/string_tensor.h"
#include "kiln/core/subprocess.h"
#include "kiln/layers/dense.h"
#include "kiln/layers/layer.h"
#include "kiln/models/functional.h"
#include "kiln/serving/batching/batching.h"
#include "kiln/serving/codec/tensor_proto.h"
#include "kiln/serving/core/warmup.h"
#include "kiln/serving/grpc/grpc_server.h"
#include "kiln/serving/serving_test_util.h"
#include "tensorflow_serving/apis/prediction_service.grpc.pb.h"

namespace kiln {
namespace {

// Each string's length in bytes, (N) strings -> (N, 1) float32.
class StringLengthForTest : public Layer {
 public:
  explicit StringLengthForTest(const Json& config) : Layer(config) {}
  std::string class_name() const override { return "StringLengthForTest"; }
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& s) override { return {{s[0][0], 1}}; }
  std::vector<at::ScalarType> compute_output_dtype(const std::vector<at::ScalarType>&) override { return {at::kFloat}; }
  Tensors call(const Tensors& x, bool) override {
    std::vector<std::string> values = strings::decode(x[0].cpu(), "StringLengthForTest's input");
    at::Tensor out = at::empty({(int64_t)values.size(), 1});
    for (size_t i = 0; i < values.size(); ++i) out[(int64_t)i][0] = (float)values[i].size();
    return {out.to(x[0].device())};
  }
};
KILN_REGISTER_LAYER(StringLengthForTest);

}  // namespace

namespace serving::string_serving_test {
namespace {

using namespace kiln::serving::testing;
namespace tfs = tensorflow::serving;

// Input "text" (a string per example) -> 2 * len + 1.
void save_text_model(const std::string& dir) {
  auto text = layers::Input({}, kStringDType, "text");
  auto len = (*std::make_shared<StringLengthForTest>(Json{{"name", "length"}}))(text);
  auto y = layers::Dense(1)(len);
  auto m = models::Functional(KerasTensors{text}, KerasTensors{y});
  for (auto& w : m->weights()) w->value().data().fill_(w->value().dim() == 2 ? 2.0f : 1.0f);  // kernel 2, bias 1
  m->save(dir);
}
float expected(const std::string& s) { return 2.0f * (float)s.size() + 1.0f; }

// A servable with a string output: "upper" = its "text" input upper-cased.
class UpperForTest : public Servable {
 public:
  UpperForTest() {
    const Json strings = {{"dtype", "string"}, {"shape", {nullptr}}};
    sig_ = {{kDefaultSignature,
             {{"inputs", {{"text", strings}}}, {"outputs", {{"upper", strings}}}, {"method_name", "predict"}}}};
  }
  TensorMap predict(const TensorMap& inputs, const std::string&) override {
    std::vector<std::string> v = strings::decode(inputs.at("text"));
    for (auto& s : v) std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::toupper(c); });
    return {{"upper", strings::encode(v, strings::logical_shape(inputs.at("text")))}};
  }
  const Json& signatures() const override { return sig_; }
  int64_t memory_bytes() const override { return 0; }

 private:
  Json sig_;
};
const bool upper_registered = [] {
  register_servable_factory("upper_for_test", [](const std::string&) { return std::make_unique<UpperForTest>(); });
  return true;
}();

std::string quoted(const std::string& s) { return "'" + s + "'"; }

// Little-endian float32 bytes (raw_output_contents) as a tensor.
at::Tensor floats_of(const std::string& bytes) {
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return at::tensor(v);
}

class StringServing : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(upper_registered);
    save_text_model(dir_.path() + "/text/1");
    save_tiny_model(dir_.path() + "/tiny/1", 1.0f);
    make_dirs(dir_.path() + "/upper/1");
    atomic_write_file(dir_.path() + "/upper/1/model.json", "{}\n");  // what makes a version directory visible
    ServerCoreOptions o;
    o.file_system_poll_wait_seconds = 0;
    o.config.models = {model_config("text", dir_.path() + "/text"), model_config("tiny", dir_.path() + "/tiny"),
                       model_config("upper", dir_.path() + "/upper")};
    o.config.models.back().model_platform = "upper_for_test";
    o.enable_batching = batching();
    o.batching.max_batch_size = 2;
    o.batching.batch_timeout_micros = 2000;
    served_ = std::make_unique<Served>(o);
    http_ = served_->client();
    FrontendOptions fo;
    fo.port = 0;
    grpc_ = std::make_unique<GrpcServer>(*served_->core, fo);
    grpc_port_ = grpc_->start();
    ASSERT_GT(grpc_port_, 0);
    auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(grpc_port_), grpc::InsecureChannelCredentials());
    predict_ = tfs::PredictionService::NewStub(channel);
    kserve_ = inference::GRPCInferenceService::NewStub(channel);
  }
  void TearDown() override {
    if (grpc_) grpc_->stop();
  }
  virtual bool batching() const { return false; }

  // POST `body`; the status and the parsed reply.
  std::pair<int, Json> post(const std::string& path, const std::string& body) {
    auto r = http_->Post(path.c_str(), body, "application/json");
    if (!r) return {0, Json()};
    return {r->status, Json::parse(r->body, nullptr, false)};
  }
  void expect_400(const std::string& path, const std::string& body, const std::string& part) {
    auto [status, j] = post(path, body);
    EXPECT_EQ(status, 400) << body << " -> " << j.dump();
    EXPECT_NE(j.value("error", "").find(part), std::string::npos) << body << " -> " << j.dump();
  }
  Json get(const std::string& path) {
    auto r = http_->Get(path.c_str());
    EXPECT_TRUE(r && r->status == 200) << path;
    return r ? Json::parse(r->body, nullptr, false) : Json();
  }
  // [[5.0], [11.0]] -> {5, 11}
  static std::vector<float> column(const Json& j) {
    std::vector<float> out;
    for (auto& row : j) out.push_back(row.is_array() ? row[0].get<float>() : row.get<float>());
    return out;
  }
  static std::vector<float> expect_all(const std::vector<std::string>& texts) {
    std::vector<float> out;
    for (auto& t : texts) out.push_back(expected(t));
    return out;
  }

  TempDir dir_;
  std::unique_ptr<Served> served_;
  std::unique_ptr<httplib::Client> http_;
  std::unique_ptr<GrpcServer> grpc_;
  int grpc_port_ = 0;
  std::unique_ptr<tfs::PredictionService::Stub> predict_;
  std::unique_ptr<inference::GRPCInferenceService::Stub> kserve_;
};

TEST_F(StringServing, TfServingRestRowsColumnarAndB64) {
  auto [s1, rows] = post("/v1/models/text:predict", R"({"instances": ["hi", "hello"]})");
  ASSERT_EQ(s1, 200) << rows.dump();
  EXPECT_EQ(column(rows["predictions"]), expect_all({"hi", "hello"}));
  auto [s2, named] = post("/v1/models/text:predict", R"({"instances": [{"text": "abc"}, {"text": ""}]})");
  ASSERT_EQ(s2, 200) << named.dump();
  EXPECT_EQ(column(named["predictions"]), expect_all({"abc", ""}));
  auto [s3, cols] = post("/v1/models/text:predict", R"({"inputs": ["a", "abcd", "naïve"]})");
  ASSERT_EQ(s3, 200) << cols.dump();
  EXPECT_EQ(column(cols["outputs"]), expect_all({"a", "abcd", "naïve"}));
  auto [s4, cols_named] = post("/v1/models/text:predict", R"({"inputs": {"text": ["xyz"]}})");
  ASSERT_EQ(s4, 200) << cols_named.dump();
  EXPECT_EQ(column(cols_named["outputs"]), expect_all({"xyz"}));
  // {"b64": ...} is the string's bytes: "hello", and three bytes with a NUL.
  auto [s5, b64] = post("/v1/models/text:predict", R"({"instances": [{"b64": "aGVsbG8="}, {"b64": "AAEC"}]})");
  ASSERT_EQ(s5, 200) << b64.dump();
  EXPECT_EQ(column(b64["predictions"]), expect_all({"hello", std::string("\0\1\2", 3)}));
  auto [s6, b64_named] = post("/v1/models/text:predict", R"({"instances": [{"text": {"b64": "aGk="}}]})");
  ASSERT_EQ(s6, 200) << b64_named.dump();
  EXPECT_EQ(column(b64_named["predictions"]), expect_all({"hi"}));
  // Classify-style regress over REST decodes examples the same way.
  auto [s7, reg] = post("/v1/models/text:regress", R"({"examples": [{"text": "hey"}]})");
  ASSERT_EQ(s7, 200) << reg.dump();
  EXPECT_FLOAT_EQ(reg["result"][0].get<float>(), expected("hey"));

  expect_400("/v1/models/text:predict", R"({"instances": [{"b64": "!!!"}]})", "instances[0]: invalid base64");
  expect_400("/v1/models/text:predict", R"({"instances": [1, 2]})", "expects dtype string. Received: 1");
  expect_400("/v1/models/text:predict", R"({"inputs": [["a"], "b"]})", "ragged");
  expect_400("/v1/models/text:predict", R"({"instances": ["a", ["b"]]})", "disagree on the shape");
  expect_400("/v1/models/tiny:predict", R"({"instances": ["abcd"]})", "expects dtype float32. Received: string");
}

TEST_F(StringServing, KServeRestBytes) {
  auto [status, j] =
      post("/v2/models/text/infer",
           R"({"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["hi", "hello"]}]})");
  ASSERT_EQ(status, 200) << j.dump();
  ASSERT_EQ(j["outputs"].size(), 1u);
  EXPECT_EQ(j["outputs"][0]["datatype"], "FP32");
  EXPECT_EQ(j["outputs"][0]["shape"], Json::parse("[2, 1]"));
  EXPECT_EQ(column(j["outputs"][0]["data"]), expect_all({"hi", "hello"}));

  expect_400("/v2/models/text/infer",
             R"({"inputs": [{"name": "text", "shape": [1], "datatype": "FP32", "data": [1]}]})",
             "input \"text\" has datatype FP32; the model expects BYTES");
  expect_400("/v2/models/text/infer",
             R"({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [1]}]})",
             "expects dtype string");
  expect_400("/v2/models/text/infer",
             R"({"inputs": [{"name": "text", "shape": [3], "datatype": "BYTES", "data": ["a", "b"]}]})", "data has 2");
  expect_400("/v2/models/tiny/infer",
             R"({"inputs": [{"name": ")" + input_name(*served_->core->get({.name = "tiny"})) +
                 R"(", "shape": [1, 4], "datatype": "BYTES", "data": ["a", "b", "c", "d"]}]})",
             "has datatype BYTES; the model expects FP32");
}

TEST_F(StringServing, MetadataSaysDtStringAndBytes) {
  Json tf = get("/v1/models/text/metadata");
  const Json& def = tf["metadata"]["signature_def"]["signature_def"]["serving_default"];
  EXPECT_EQ(def["inputs"]["text"]["dtype"], "DT_STRING") << tf.dump();
  Json v2 = get("/v2/models/text");
  EXPECT_EQ(v2["inputs"][0]["datatype"], "BYTES") << v2.dump();
  EXPECT_EQ(v2["inputs"][0]["shape"], Json::parse("[-1]")) << v2.dump();
  Json upper = get("/v2/models/upper");
  EXPECT_EQ(upper["outputs"][0]["datatype"], "BYTES") << upper.dump();

  tfs::GetModelMetadataRequest mreq;
  mreq.mutable_model_spec()->set_name("text");
  mreq.add_metadata_field("signature_def");
  tfs::GetModelMetadataResponse mresp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(predict_->GetModelMetadata(&ctx, mreq, &mresp).ok());
  tfs::SignatureDefMap map;
  ASSERT_TRUE(mresp.metadata().at("signature_def").UnpackTo(&map));
  EXPECT_EQ(map.signature_def().at("serving_default").inputs().at("text").dtype(), tensorflow::DT_STRING);

  inference::ModelMetadataRequest q;
  q.set_name("text");
  inference::ModelMetadataResponse r;
  grpc::ClientContext ctx2;
  ASSERT_TRUE(kserve_->ModelMetadata(&ctx2, q, &r).ok());
  ASSERT_EQ(r.inputs_size(), 1);
  EXPECT_EQ(r.inputs(0).datatype(), "BYTES");
}

TEST_F(StringServing, TfServingGrpcDtString) {
  tfs::PredictRequest req;
  req.mutable_model_spec()->set_name("text");
  to_tensor_proto({3}, {"hi", "hello", std::string("a\0b", 3)}, &(*req.mutable_inputs())["text"]);
  tfs::PredictResponse resp;
  {
    grpc::ClientContext ctx;
    auto s = predict_->Predict(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  at::Tensor y = from_tensor_proto(resp.outputs().begin()->second, "out").tensor;
  EXPECT_TRUE(at::equal(y.flatten(), at::tensor(expect_all({"hi", "hello", "abc"}))));

  // A float tensor for the string input, and strings for a float input.
  to_tensor_proto(at::ones({1}), &(*req.mutable_inputs())["text"]);
  grpc::ClientContext ctx;
  auto s = predict_->Predict(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("inputs['text'] expects dtype string. Received: float32"), std::string::npos)
      << s.error_message();
  tfs::PredictRequest tiny;
  tiny.mutable_model_spec()->set_name("tiny");
  to_tensor_proto({1, 4}, {"a", "b", "c", "d"},
                  &(*tiny.mutable_inputs())[input_name(*served_->core->get({.name = "tiny"}))]);
  grpc::ClientContext ctx2;
  s = predict_->Predict(&ctx2, tiny, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("expects dtype float32. Received: string"), std::string::npos) << s.error_message();
}

TEST_F(StringServing, GrpcRegressTakesBytesListFeatures) {
  tfs::RegressionRequest req;
  req.mutable_model_spec()->set_name("text");
  for (std::string text : {"hey", "hello"}) {
    auto* f = req.mutable_input()->mutable_example_list()->add_examples()->mutable_features();
    (*f->mutable_feature())["text"].mutable_bytes_list()->add_value(text);
  }
  tfs::RegressionResponse resp;
  {
    grpc::ClientContext ctx;
    auto s = predict_->Regress(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  ASSERT_EQ(resp.result().regressions_size(), 2);
  EXPECT_FLOAT_EQ(resp.result().regressions(0).value(), expected("hey"));
  EXPECT_FLOAT_EQ(resp.result().regressions(1).value(), expected("hello"));
  // A float_list for the string input.
  req.mutable_input()->mutable_example_list()->clear_examples();
  auto* f = req.mutable_input()->mutable_example_list()->add_examples()->mutable_features();
  (*f->mutable_feature())["text"].mutable_float_list()->add_value(1);
  grpc::ClientContext ctx;
  auto s = predict_->Regress(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("expects dtype string: send bytes_list"), std::string::npos) << s.error_message();
}

TEST_F(StringServing, KServeGrpcBytesInContentsAndRawInputContents) {
  for (bool raw : {false, true}) {
    inference::ModelInferRequest q;
    q.set_model_name("text");
    auto* in = q.add_inputs();
    in->set_name("text");
    in->set_datatype("BYTES");
    in->add_shape(2);
    if (raw) {
      // Triton's layout: each element a 4-byte little-endian length, then its bytes.
      std::string buf;
      for (std::string v : {"hi", "hello"}) {
        uint32_t n = (uint32_t)v.size();
        buf.append(reinterpret_cast<const char*>(&n), 4);
        buf += v;
      }
      q.add_raw_input_contents(buf);
    } else {
      in->mutable_contents()->add_bytes_contents("hi");
      in->mutable_contents()->add_bytes_contents("hello");
    }
    inference::ModelInferResponse r;
    grpc::ClientContext ctx;
    auto s = kserve_->ModelInfer(&ctx, q, &r);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(r.outputs_size(), 1);
    at::Tensor y = raw ? floats_of(r.raw_output_contents(0))
                       : at::tensor(std::vector<float>(r.outputs(0).contents().fp32_contents().begin(),
                                                       r.outputs(0).contents().fp32_contents().end()));
    EXPECT_TRUE(at::equal(y, at::tensor(expect_all({"hi", "hello"})))) << raw;
  }
  inference::ModelInferRequest q;
  q.set_model_name("text");
  auto* in = q.add_inputs();
  in->set_name("text");
  in->set_datatype("FP32");
  in->add_shape(1);
  in->mutable_contents()->add_fp32_contents(1);
  inference::ModelInferResponse r;
  grpc::ClientContext ctx;
  auto s = kserve_->ModelInfer(&ctx, q, &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("has datatype FP32; the model expects BYTES"), std::string::npos)
      << s.error_message();
}

TEST_F(StringServing, StringOutputsGoBackAsStrings) {
  auto [s1, rows] = post("/v1/models/upper:predict", R"({"instances": ["hi", "héllo"]})");
  ASSERT_EQ(s1, 200) << rows.dump();
  EXPECT_EQ(rows["predictions"], Json::parse(R"(["HI", "HéLLO"])"));
  auto [s2, cols] = post("/v1/models/upper:predict", R"({"inputs": [["a", "b"]]})");
  ASSERT_EQ(s2, 200) << cols.dump();
  EXPECT_EQ(cols["outputs"], Json::parse(R"([["A", "B"]])"));
  auto [s3, v2] = post("/v2/models/upper/infer",
                       R"({"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["x", "y"]}]})");
  ASSERT_EQ(s3, 200) << v2.dump();
  EXPECT_EQ(v2["outputs"][0]["datatype"], "BYTES");
  EXPECT_EQ(v2["outputs"][0]["shape"], Json::parse("[2]"));
  EXPECT_EQ(v2["outputs"][0]["data"], Json::parse(R"(["X", "Y"])"));

  tfs::PredictRequest req;
  req.mutable_model_spec()->set_name("upper");
  to_tensor_proto({2}, {"ab", "c"}, &(*req.mutable_inputs())["text"]);
  tfs::PredictResponse resp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(predict_->Predict(&ctx, req, &resp).ok());
  const auto& out = resp.outputs().at("upper");
  EXPECT_EQ(out.dtype(), tensorflow::DT_STRING);
  EXPECT_EQ(std::vector<std::string>(out.string_val().begin(), out.string_val().end()),
            (std::vector<std::string>{"AB", "C"}));

  for (bool raw : {false, true}) {
    inference::ModelInferRequest q;
    q.set_model_name("upper");
    auto* in = q.add_inputs();
    in->set_name("text");
    in->set_datatype("BYTES");
    in->add_shape(1);
    if (raw)
      q.add_raw_input_contents(std::string("\3\0\0\0abc", 7));
    else
      in->mutable_contents()->add_bytes_contents("abc");
    inference::ModelInferResponse r;
    grpc::ClientContext c;
    auto s = kserve_->ModelInfer(&c, q, &r);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(r.outputs(0).datatype(), "BYTES");
    if (raw)
      EXPECT_EQ(r.raw_output_contents(0), std::string("\3\0\0\0ABC", 7));
    else
      EXPECT_EQ(r.outputs(0).contents().bytes_contents(0), "ABC");
  }
}

TEST_F(StringServing, WarmupRequestsMayHoldStrings) {
  const std::string v = dir_.path() + "/text/1";
  make_dirs(v + "/assets/extra");
  atomic_write_file(v + "/assets/extra/warmup_requests.jsonl",
                    "{\"instances\": [\"warm\", \"up\"]}\n{\"inputs\": {\"text\": [{\"b64\": \"aGk=\"}]}}\n");
  ModelServable s(v);
  EXPECT_EQ(replay_warmup(s, v), 2);
  atomic_write_file(v + "/assets/extra/warmup_requests.jsonl", "{\"instances\": [1]}\n");
  EXPECT_THROW(replay_warmup(s, v), FormatError);
  // The servable itself refuses a numeric tensor for the string input.
  try {
    s.predict({{"text", at::ones({2})}}, kDefaultSignature);
    ADD_FAILURE() << "a float tensor was taken for a string input";
  } catch (const ServingError& e) {
    EXPECT_NE(std::string(e.what()).find("input 'text' expects dtype string. Received: float32"), std::string::npos)
        << e.what();
  }
}

class StringServingBatched : public StringServing {
  bool batching() const override { return true; }
};

TEST_F(StringServingBatched, RequestsOfDifferentWidthsShareABatch) {
  // Concurrent requests of widths 1 and 11 (max_batch_size 2): answered alike whether they batch or not.
  for (int round = 0; round < 5; ++round) {
    auto a = std::async(std::launch::async, [&] { return post("/v1/models/text:predict", R"({"instances": ["a"]})"); });
    auto b = std::async(std::launch::async,
                        [&] { return post("/v1/models/text:predict", R"({"instances": ["hello world"]})"); });
    auto ra = a.get(), rb = b.get();
    ASSERT_EQ(ra.first, 200) << ra.second.dump();
    ASSERT_EQ(rb.first, 200) << rb.second.dump();
    EXPECT_EQ(column(ra.second["predictions"]), expect_all({"a"}));
    EXPECT_EQ(column(rb.second["predictions"]), expect_all({"hello world"}));
  }
  // A request larger than max_batch_size is split and its string outputs joined.
  auto [s, j] = post("/v1/models/upper:predict", R"({"instances": ["a", "bbbbbb", "cc"]})");
  ASSERT_EQ(s, 200) << j.dump();
  EXPECT_EQ(j["predictions"], Json::parse(R"(["A", "BBBBBB", "CC"])"));
}

TEST(StringBatching, JoinsWidthsWithPaddingAndSplitsThemBack) {
  // Two requests, widths 1 and 5, in one batch of 2 (it closes when full):
  // the batch function sees one string tensor of the wider width.
  std::vector<at::Tensor> seen;
  std::mutex mu;
  BatchingOptions o;
  o.max_batch_size = 2;
  o.batch_timeout_micros = 60 * 1000 * 1000;  // only a full batch closes
  o.num_batch_threads = 1;
  SharedBatchScheduler scheduler(o);
  StringTensorNames names;
  names.inputs = {"text"};
  names.outputs = {"echo"};
  StringSignatures strings{{kDefaultSignature, names}};
  auto queue = scheduler.add_queue(
      o,
      [&](const std::string&, const TensorMap& batch) {
        std::lock_guard<std::mutex> l(mu);
        seen.push_back(batch.at("text"));
        return TensorMap{{"echo", batch.at("text")}};
      },
      strings);
  auto a = std::async(std::launch::async, [&] {
    return scheduler.run(queue, kDefaultSignature, {{"text", strings::encode({"a"})}});
  });
  auto b = std::async(std::launch::async, [&] {
    return scheduler.run(queue, kDefaultSignature, {{"text", strings::encode({"hello"})}});
  });
  TensorMap ya = a.get(), yb = b.get();
  ASSERT_EQ(seen.size(), 1u) << "the two widths formed one lane";
  EXPECT_EQ(seen[0].sizes().vec(), (std::vector<int64_t>{2, 4 + 5}));
  EXPECT_EQ(strings::decode(ya.at("echo")), std::vector<std::string>{"a"});
  EXPECT_EQ(strings::decode(yb.at("echo")), std::vector<std::string>{"hello"});
  scheduler.remove_queue(queue);
}

TEST_F(StringServing, KilnPredictGrpcTakesJsonStrings) {
  const std::string target = "127.0.0.1:" + std::to_string(grpc_port_);
  const std::string in = dir_.path() + "/in.jsonl";
  atomic_write_file(in, "\"hi\"\n{\"text\": \"hello\"}\n{\"inputs\": \"abc\"}\n{\"b64\": \"aGk=\"}\n");
  auto r = run_command(quoted(cli_path()) + " predict --grpc " + target + " --model_name text --batch_size 2 --input " +
                       quoted(in) + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::istringstream lines(r.output);
  std::string line;
  for (std::string text : {"hi", "hello", "abc", "hi"}) {
    ASSERT_TRUE(std::getline(lines, line)) << r.output;
    EXPECT_FLOAT_EQ(Json::parse(line)["predictions"][0].get<float>(), expected(text)) << line;
  }
  // String outputs are written as strings.
  r = run_command("printf '\"ab\"\\n' | " + quoted(cli_path()) + " predict --grpc " + target +
                  " --model_name upper 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "{\"predictions\":\"AB\"}\n");
  // A number for the string input: one line, exit 2, naming the line.
  atomic_write_file(in, "\"hi\"\n[1]\n");
  r = run_command("( " + quoted(cli_path()) + " predict --grpc " + target + " --model_name text --input " + quoted(in) +
                  " 2>&1 1>/dev/null )");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_NE(r.output.find("line 2: input 'text' expects dtype string. Received: 1 at [0]"), std::string::npos)
      << r.output;
}

TEST_F(StringServing, BatchPredictTakesJsonStrings) {
  const std::string in = dir_.path() + "/bp.jsonl";
  atomic_write_file(in, "\"hi\"\n{\"text\": \"hello\"}\n7\n\"a\"\n");
  batch::BatchPredictOptions o;
  o.model_dir = dir_.path() + "/text/1";
  o.inputs = {in};
  o.output_dir = dir_.path() + "/bp";
  o.batch_size = 2;
  batch::BatchPredictReport rep = batch::batch_predict(o);
  EXPECT_EQ(rep.predictions, 3);
  EXPECT_EQ(rep.errors, 1);
  std::istringstream results(read_file(o.output_dir + "/" + batch::shard_file_name("prediction.results", 0, 1)));
  std::string line;
  for (std::string text : {"hi", "hello", "a"}) {
    ASSERT_TRUE(std::getline(results, line));
    EXPECT_FLOAT_EQ(Json::parse(line)["prediction"][0].get<float>(), expected(text)) << line;
  }
  const std::string errors = read_file(o.output_dir + "/" + batch::shard_file_name("prediction.errors_stats", 0, 1));
  EXPECT_NE(errors.find("expects dtype string. Received: 7"), std::string::npos) << errors;
}

}  // namespace
}  // namespace serving::string_serving_test
}  // namespace kiln
