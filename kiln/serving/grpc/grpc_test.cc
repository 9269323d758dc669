// The gRPC front end with real grpc::Channel clients on loopback: every RPC
// of PredictionService, ModelService and KServe's GRPCInferenceService, both
// tensor encodings, error codes, metadata, status and config reload.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <pthread.h>

#include <chrono>
#include <fstream>
#include <thread>
#include <vector>

#include "inference/grpc_predict_v2.grpc.pb.h"
#include "kiln/core/io.h"
#include "kiln/core/random.h"
#include "kiln/layers/dense.h"
#include "kiln/models/sequential.h"
#include "kiln/serving/codec/tensor_proto.h"
#include "kiln/serving/core/server_core.h"
#include "kiln/serving/grpc/grpc_server.h"
#include "kiln/testing/testing.h"
#include "tensorflow_serving/apis/model_service.grpc.pb.h"
#include "tensorflow_serving/apis/prediction_service.grpc.pb.h"

namespace kiln::serving {
namespace {

namespace tfs = tensorflow::serving;

std::shared_ptr<models::SequentialImpl> save_model(const std::string& dir, int64_t in, int64_t out,
                                                   const std::string& act) {
  auto m = models::Sequential();
  m->add(layers::Input({in}));
  m->add(layers::Dense(out, act));
  m->save(dir);
  return m;
}

class GrpcServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    set_random_seed(11);
    clf_ = save_model(dir_.path() + "/clf/1", 4, 3, "softmax");
    ServerCoreOptions o;
    ModelConfig mc;
    mc.name = "clf";
    mc.base_path = dir_.path() + "/clf";
    mc.version_labels["stable"] = 1;
    o.config.models.push_back(mc);
    o.file_system_poll_wait_seconds = 0;
    core_ = std::make_unique<ServerCore>(o);
    core_->start();
    FrontendOptions fo;
    fo.port = 0;
    fo.enable_admin = true;
    fo.admin_token = "adm1n";
    server_ = std::make_unique<GrpcServer>(*core_, fo);
    int port = server_->start();
    ASSERT_GT(port, 0);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
    predict_ = tfs::PredictionService::NewStub(channel_);
    models_ = tfs::ModelService::NewStub(channel_);
    kserve_ = inference::GRPCInferenceService::NewStub(channel_);
  }
  void TearDown() override {
    server_->stop();
    core_->stop();
  }

  tfs::PredictRequest predict_request(const at::Tensor& x, TensorEncoding enc) {
    tfs::PredictRequest req;
    req.mutable_model_spec()->set_name("clf");
    to_tensor_proto(x, &(*req.mutable_inputs())["inputs"], enc);
    return req;
  }

  TempDir dir_;
  std::shared_ptr<models::SequentialImpl> clf_;
  std::unique_ptr<ServerCore> core_;
  std::unique_ptr<GrpcServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<tfs::PredictionService::Stub> predict_;
  std::unique_ptr<tfs::ModelService::Stub> models_;
  std::unique_ptr<inference::GRPCInferenceService::Stub> kserve_;
};

TEST_F(GrpcServerTest, PredictInBothTensorEncodings) {
  auto x = at::randn({5, 4});
  auto want = clf_->predict(x);
  for (auto enc : {TensorEncoding::kTypedValues, TensorEncoding::kTensorContent}) {
    auto req = predict_request(x, enc);
    tfs::PredictResponse resp;
    grpc::ClientContext ctx;
    auto s = predict_->Predict(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.model_spec().name(), "clf");
    EXPECT_EQ(resp.model_spec().version().value(), 1);
    EXPECT_EQ(resp.model_spec().signature_name(), "serving_default");
    ASSERT_EQ(resp.outputs().size(), 1u);
    auto y = from_tensor_proto(resp.outputs().begin()->second, "out").tensor;
    EXPECT_TRUE(at::allclose(y, want, 1e-6, 1e-6));
  }
  // By label, with an output filter, and one value filling the shape.
  tfs::PredictRequest req;
  req.mutable_model_spec()->set_name("clf");
  req.mutable_model_spec()->set_version_label("stable");
  auto& in = (*req.mutable_inputs())["inputs"];
  in.set_dtype(tensorflow::DT_FLOAT);
  shape_to_proto({2, 4}, in.mutable_tensor_shape());
  in.add_float_val(0.5f);
  const std::string out_name = clf_->output_names()[0];
  req.add_output_filter(out_name);
  tfs::PredictResponse resp;
  grpc::ClientContext ctx;
  auto s = predict_->Predict(&ctx, req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  auto y = from_tensor_proto(resp.outputs().at(out_name), "out").tensor;
  EXPECT_TRUE(at::allclose(y, clf_->predict(at::full({2, 4}, 0.5f)), 1e-6, 1e-6));
}

TEST_F(GrpcServerTest, PredictErrorsCarryTheRightCodes) {
  auto call = [&](tfs::PredictRequest req) {
    tfs::PredictResponse resp;
    grpc::ClientContext ctx;
    return predict_->Predict(&ctx, req, &resp);
  };
  auto good = predict_request(at::randn({2, 4}), TensorEncoding::kTypedValues);

  auto r = good;
  r.mutable_model_spec()->set_name("nope");
  EXPECT_EQ(call(r).error_code(), grpc::StatusCode::NOT_FOUND);
  r = good;
  r.mutable_model_spec()->mutable_version()->set_value(7);
  EXPECT_EQ(call(r).error_code(), grpc::StatusCode::NOT_FOUND);
  r = good;
  r.mutable_model_spec()->set_version_label("canary");
  EXPECT_EQ(call(r).error_code(), grpc::StatusCode::NOT_FOUND);
  r = good;
  r.mutable_model_spec()->clear_name();
  EXPECT_EQ(call(r).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  r = good;
  r.mutable_model_spec()->set_signature_name("nope");
  EXPECT_EQ(call(r).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  r = good;
  r.add_output_filter("nope");
  auto s = call(r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("output tensor alias not found"), std::string::npos) << s.error_message();
  r = good;
  (*r.mutable_inputs())["inputs"].add_float_val(1.0f);  // 9 values for a (2, 4) shape
  s = call(r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("float_val holds 9 values"), std::string::npos) << s.error_message();
  r = predict_request(at::randn({2, 5}), TensorEncoding::kTensorContent);  // wrong width
  EXPECT_EQ(call(r).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// MultiInference: tasks over one shared input, each answered as its own
// Classify would be; TF Serving's refusals for mixed models and repeats.
TEST_F(GrpcServerTest, MultiInferenceAnswersEachTaskAsClassifyWould) {
  tfs::MultiInferenceRequest req;
  auto x = at::randn({2, 4});
  for (int i = 0; i < 2; ++i) {
    auto* f = req.mutable_input()->mutable_example_list()->add_examples()->mutable_features();
    auto* fl = (*f->mutable_feature())["inputs"].mutable_float_list();
    for (int k = 0; k < 4; ++k) fl->add_value(x[i][k].item<float>());
  }
  auto* task = req.add_tasks();
  task->mutable_model_spec()->set_name("clf");
  task->set_method_name("tensorflow/serving/classify");
  tfs::MultiInferenceResponse resp;
  {
    grpc::ClientContext ctx;
    auto s = predict_->MultiInference(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  auto want = clf_->predict(x);
  ASSERT_EQ(resp.results_size(), 1);
  EXPECT_EQ(resp.results(0).model_spec().name(), "clf");
  EXPECT_EQ(resp.results(0).model_spec().version().value(), 1);
  const auto& cr = resp.results(0).classification_result();
  ASSERT_EQ(cr.classifications_size(), 2);
  for (int i = 0; i < 2; ++i)
    for (int k = 0; k < 3; ++k) EXPECT_NEAR(cr.classifications(i).classes(k).score(), want[i][k].item<float>(), 1e-6);

  auto expect_invalid = [&](const tfs::MultiInferenceRequest& r, const std::string& part) {
    grpc::ClientContext ctx;
    tfs::MultiInferenceResponse out;
    auto s = predict_->MultiInference(&ctx, r, &out);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_NE(s.error_message().find(part), std::string::npos) << s.error_message();
  };
  tfs::MultiInferenceRequest twice = req;
  *twice.add_tasks() = req.tasks(0);
  expect_invalid(twice, "Duplicate evaluation of signature");
  tfs::MultiInferenceRequest other = req;
  auto* t2 = other.add_tasks();
  t2->mutable_model_spec()->set_name("reg");
  t2->set_method_name("tensorflow/serving/regress");
  expect_invalid(other, "same model");
  tfs::MultiInferenceRequest bad_method = req;
  bad_method.mutable_tasks(0)->set_method_name("tensorflow/serving/predict");
  expect_invalid(bad_method, "Unsupported signature method_name");
  expect_invalid(tfs::MultiInferenceRequest(), "at least one task");
}

TEST_F(GrpcServerTest, ClassifyAndRegressFromExamples) {
  tfs::ClassificationRequest req;
  req.mutable_model_spec()->set_name("clf");
  auto x = at::randn({3, 4});
  for (int i = 0; i < 3; ++i) {
    auto* f = req.mutable_input()->mutable_example_list()->add_examples()->mutable_features();
    auto* fl = (*f->mutable_feature())["inputs"].mutable_float_list();
    for (int k = 0; k < 4; ++k) fl->add_value(x[i][k].item<float>());
  }
  tfs::ClassificationResponse resp;
  {
    grpc::ClientContext ctx;
    auto s = predict_->Classify(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  auto want = clf_->predict(x);
  ASSERT_EQ(resp.result().classifications_size(), 3);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(resp.result().classifications(i).classes_size(), 3);
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(resp.result().classifications(i).classes(k).label(), std::to_string(k));
      EXPECT_NEAR(resp.result().classifications(i).classes(k).score(), want[i][k].item<float>(), 1e-6);
    }
  }
  // A feature of the wrong length is INVALID_ARGUMENT; Regress on a 3-wide output too.
  (*req.mutable_input()->mutable_example_list()->mutable_examples(1)->mutable_features()->mutable_feature())["inputs"]
      .mutable_float_list()
      ->add_value(1);
  grpc::ClientContext ctx;
  auto s = predict_->Classify(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("example 1, feature 'inputs' holds 5 values"), std::string::npos)
      << s.error_message();
  tfs::RegressionRequest rr;
  rr.mutable_model_spec()->set_name("clf");
  *rr.mutable_input() = req.input();
  rr.mutable_input()->mutable_example_list()->mutable_examples()->DeleteSubrange(1, 1);
  tfs::RegressionResponse rresp;
  grpc::ClientContext ctx2;
  EXPECT_EQ(predict_->Regress(&ctx2, rr, &rresp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(GrpcServerTest, MetadataStatusAndReloadConfig) {
  tfs::GetModelMetadataRequest mreq;
  mreq.mutable_model_spec()->set_name("clf");
  mreq.add_metadata_field("signature_def");
  tfs::GetModelMetadataResponse mresp;
  {
    grpc::ClientContext ctx;
    auto s = predict_->GetModelMetadata(&ctx, mreq, &mresp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_EQ(mresp.model_spec().version().value(), 1);
  tfs::SignatureDefMap map;
  ASSERT_TRUE(mresp.metadata().at("signature_def").UnpackTo(&map));
  const auto& def = map.signature_def().at("serving_default");
  EXPECT_EQ(def.method_name(), "tensorflow/serving/predict");
  const auto& in = def.inputs().at("inputs");
  EXPECT_EQ(in.dtype(), tensorflow::DT_FLOAT);
  ASSERT_EQ(in.tensor_shape().dim_size(), 2);
  EXPECT_EQ(in.tensor_shape().dim(0).size(), -1);
  EXPECT_EQ(in.tensor_shape().dim(1).size(), 4);
  mreq.clear_metadata_field();
  {
    grpc::ClientContext ctx;
    EXPECT_EQ(predict_->GetModelMetadata(&ctx, mreq, &mresp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }

  tfs::GetModelStatusRequest sreq;
  sreq.mutable_model_spec()->set_name("clf");
  tfs::GetModelStatusResponse sresp;
  {
    grpc::ClientContext ctx;
    auto s = models_->GetModelStatus(&ctx, sreq, &sresp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  ASSERT_EQ(sresp.model_version_status_size(), 1);
  EXPECT_EQ(sresp.model_version_status(0).version(), 1);
  EXPECT_EQ(sresp.model_version_status(0).state(), tfs::ModelVersionStatus::AVAILABLE);
  EXPECT_EQ(sresp.model_version_status(0).status().error_code(), tensorflow::error::OK);
  sreq.mutable_model_spec()->set_name("nope");
  {
    grpc::ClientContext ctx;
    EXPECT_EQ(models_->GetModelStatus(&ctx, sreq, &sresp).error_code(), grpc::StatusCode::NOT_FOUND);
  }

  // Reload: keep clf, add a regression model; then regress on it.
  {  // admin calls need the admin token (FrontendOptions::admin_token)
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer wrong");
    tfs::ReloadConfigResponse r;
    EXPECT_EQ(models_->HandleReloadConfigRequest(&ctx, {}, &r).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  auto reg = save_model(dir_.path() + "/reg/3", 2, 1, "linear");
  tfs::ReloadConfigRequest rreq;
  auto* list = rreq.mutable_config()->mutable_model_config_list();
  auto* c1 = list->add_config();
  c1->set_name("clf");
  c1->set_base_path(dir_.path() + "/clf");
  auto* c2 = list->add_config();
  c2->set_name("reg");
  c2->set_base_path(dir_.path() + "/reg");
  c2->mutable_model_version_policy()->mutable_all();
  tfs::ReloadConfigResponse rresp;
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer adm1n");
    auto s = models_->HandleReloadConfigRequest(&ctx, rreq, &rresp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_EQ(rresp.status().error_code(), tensorflow::error::OK);
  ASSERT_TRUE(core_->wait_until_ready({.name = "reg"}, 30));
  tfs::RegressionRequest rr;
  rr.mutable_model_spec()->set_name("reg");
  auto* ex = rr.mutable_input()->mutable_example_list()->add_examples();
  auto* fl = (*ex->mutable_features()->mutable_feature())["inputs"].mutable_float_list();
  fl->add_value(1.5f);
  fl->add_value(-2.0f);
  tfs::RegressionResponse regr;
  {
    grpc::ClientContext ctx;
    auto s = predict_->Regress(&ctx, rr, &regr);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  ASSERT_EQ(regr.result().regressions_size(), 1);
  EXPECT_NEAR(regr.result().regressions(0).value(),
              reg->predict(at::tensor({1.5f, -2.0f}).reshape({1, 2}))[0][0].item<float>(), 1e-6);
  EXPECT_EQ(regr.model_spec().version().value(), 3);

  c2->set_name("bad name!");
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer adm1n");
    auto s = models_->HandleReloadConfigRequest(&ctx, rreq, &rresp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    // gRPC sends no response body with a non-OK status; the message names the problem.
    EXPECT_NE(s.error_message().find("bad name!"), std::string::npos) << s.error_message();
  }
  // The rejected config changed nothing: "reg" still serves.
  EXPECT_TRUE(core_->wait_until_ready({.name = "reg"}, 5));
}

TEST_F(GrpcServerTest, KServeHealthMetadataAndInfer) {
  {
    grpc::ClientContext ctx;
    inference::ServerLiveResponse r;
    ASSERT_TRUE(kserve_->ServerLive(&ctx, {}, &r).ok());
    EXPECT_TRUE(r.live());
  }
  {
    grpc::ClientContext ctx;
    inference::ServerReadyResponse r;
    ASSERT_TRUE(kserve_->ServerReady(&ctx, {}, &r).ok());
    EXPECT_TRUE(r.ready());
  }
  {
    grpc::ClientContext ctx;
    inference::ModelReadyRequest q;
    q.set_name("clf");
    q.set_version("1");
    inference::ModelReadyResponse r;
    ASSERT_TRUE(kserve_->ModelReady(&ctx, q, &r).ok());
    EXPECT_TRUE(r.ready());
  }
  {
    grpc::ClientContext ctx;
    inference::ServerMetadataResponse r;
    ASSERT_TRUE(kserve_->ServerMetadata(&ctx, {}, &r).ok());
    EXPECT_EQ(r.name(), "kiln");
  }
  {
    grpc::ClientContext ctx;
    inference::ModelMetadataRequest q;
    q.set_name("clf");
    inference::ModelMetadataResponse r;
    auto s = kserve_->ModelMetadata(&ctx, q, &r);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(r.versions(0), "1");
    ASSERT_EQ(r.inputs_size(), 1);
    EXPECT_EQ(r.inputs(0).name(), "inputs");
    EXPECT_EQ(r.inputs(0).datatype(), "FP32");
    EXPECT_EQ(std::vector<int64_t>(r.inputs(0).shape().begin(), r.inputs(0).shape().end()),
              (std::vector<int64_t>{-1, 4}));
  }
  auto x = at::randn({3, 4});
  auto want = clf_->predict(x);
  for (bool raw : {false, true}) {
    inference::ModelInferRequest q;
    q.set_model_name("clf");
    q.set_id("req-7");
    auto* in = q.add_inputs();
    inference::ModelInferResponse::InferOutputTensor enc;
    std::string bytes;
    to_infer_output("inputs", x, &enc, raw ? &bytes : nullptr);
    in->set_name("inputs");
    in->set_datatype("FP32");
    in->add_shape(3);
    in->add_shape(4);
    if (raw)
      q.add_raw_input_contents(bytes);
    else
      *in->mutable_contents() = enc.contents();
    inference::ModelInferResponse r;
    grpc::ClientContext ctx;
    auto s = kserve_->ModelInfer(&ctx, q, &r);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(r.id(), "req-7");
    EXPECT_EQ(r.model_version(), "1");
    ASSERT_EQ(r.outputs_size(), 1);
    inference::ModelInferRequest::InferInputTensor back;
    back.set_name(r.outputs(0).name());
    back.set_datatype(r.outputs(0).datatype());
    *back.mutable_shape() = r.outputs(0).shape();
    *back.mutable_contents() = r.outputs(0).contents();
    ASSERT_EQ(r.raw_output_contents_size(), raw ? 1 : 0);
    auto y = from_infer_input(back, raw ? &r.raw_output_contents(0) : nullptr).tensor;
    EXPECT_TRUE(at::allclose(y, want, 1e-6, 1e-6)) << "raw=" << raw;
  }
  // Errors: unknown model, bad version, short contents.
  inference::ModelInferRequest q;
  q.set_model_name("nope");
  inference::ModelInferResponse r;
  {
    grpc::ClientContext ctx;
    EXPECT_EQ(kserve_->ModelInfer(&ctx, q, &r).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  q.set_model_name("clf");
  q.set_model_version("x");
  {
    grpc::ClientContext ctx;
    EXPECT_EQ(kserve_->ModelInfer(&ctx, q, &r).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  q.clear_model_version();
  auto* in = q.add_inputs();
  in->set_name("inputs");
  in->set_datatype("FP32");
  in->add_shape(1);
  in->add_shape(4);
  in->mutable_contents()->add_fp32_contents(1);
  {
    grpc::ClientContext ctx;
    auto s = kserve_->ModelInfer(&ctx, q, &r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("fp32_contents holds 1 values"), std::string::npos) << s.error_message();
  }
}

// --- the async server under load: batching on ---------------------------------------
class GrpcAsyncTest : public ::testing::Test {
 protected:
  // One model "clf" (4 -> 3) served with batching: up to `max_batch` rows,
  // waiting up to `timeout_micros` for a batch to fill, one batch thread.
  void serve(int64_t max_batch, int64_t timeout_micros) {
    set_random_seed(5);
    clf_ = save_model(dir_.path() + "/clf/1", 4, 3, "softmax");
    ServerCoreOptions o;
    ModelConfig mc;
    mc.name = "clf";
    mc.base_path = dir_.path() + "/clf";
    o.config.models.push_back(mc);
    o.file_system_poll_wait_seconds = 0;
    o.enable_batching = true;
    o.batching.max_batch_size = max_batch;
    o.batching.batch_timeout_micros = timeout_micros;
    o.batching.num_batch_threads = 1;
    o.batching.max_enqueued_batches = 1000;
    core_ = std::make_unique<ServerCore>(o);
    core_->start();
    FrontendOptions fo;
    fo.num_threads = 4;
    server_ = std::make_unique<GrpcServer>(*core_, fo);
    int port = server_->start();
    ASSERT_GT(port, 0);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
    predict_ = tfs::PredictionService::NewStub(channel_);
  }
  void TearDown() override {
    if (server_) server_->stop();
    if (core_) core_->stop();
  }

  // One in-flight async Predict of one row.
  struct Pending {
    at::Tensor x;
    grpc::ClientContext ctx;
    tfs::PredictResponse resp;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<tfs::PredictResponse>> rpc;
  };
  // Sends n one-row calls on `cq`; each Pending is its own tag.
  std::vector<std::unique_ptr<Pending>> send(int n, grpc::CompletionQueue* cq) {
    std::vector<std::unique_ptr<Pending>> calls;
    for (int i = 0; i < n; ++i) {
      auto p = std::make_unique<Pending>();
      p->x = at::randn({1, 4});
      p->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      tfs::PredictRequest req;
      req.mutable_model_spec()->set_name("clf");
      to_tensor_proto(p->x, &(*req.mutable_inputs())["inputs"]);
      p->rpc = predict_->AsyncPredict(&p->ctx, req, cq);
      p->rpc->Finish(&p->resp, &p->status, p.get());
      calls.push_back(std::move(p));
    }
    return calls;
  }
  // Waits for n answers (each at most 60 s); then closes `cq`.
  static int wait_all(int n, grpc::CompletionQueue* cq) {
    int got = 0;
    for (; got < n; ++got) {
      void* tag;
      bool ok;
      if (cq->AsyncNext(&tag, &ok, std::chrono::system_clock::now() + std::chrono::seconds(60)) !=
          grpc::CompletionQueue::NextStatus::GOT_EVENT)
        break;
    }
    if (got == n) {  // a queue is shut down and drained before it goes
      cq->Shutdown();
      void* tag;
      bool ok;
      while (cq->Next(&tag, &ok)) {
      }
    }
    return got;
  }
  // Mean rows per executed batch, from the core's kiln_batch_size histogram.
  double mean_batch_size() {
    const std::string text = core_->metrics().expose();
    auto value = [&](const std::string& series) {
      auto at = text.find(series + "{model=\"clf\"} ");
      return at == std::string::npos ? 0.0 : std::stod(text.substr(at + series.size() + 14));
    };
    double count = value("kiln_batch_size_count");
    return count > 0 ? value("kiln_batch_size_sum") / count : 0.0;
  }

  TempDir dir_;
  std::shared_ptr<models::SequentialImpl> clf_;
  std::unique_ptr<ServerCore> core_;
  std::unique_ptr<GrpcServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<tfs::PredictionService::Stub> predict_;
};

TEST_F(GrpcAsyncTest, SixtyFourConcurrentCallsAreAnsweredInBatches) {
  serve(32, 20000);
  grpc::CompletionQueue cq;
  auto calls = send(64, &cq);
  ASSERT_EQ(wait_all(64, &cq), 64);
  for (auto& c : calls) {
    ASSERT_TRUE(c->status.ok()) << c->status.error_message();
    ASSERT_EQ(c->resp.outputs().size(), 1u);
    auto y = from_tensor_proto(c->resp.outputs().begin()->second, "out").tensor;
    EXPECT_TRUE(at::allclose(y, clf_->predict(c->x), 1e-5, 1e-5));
  }
  // 64 rows in flight at once, 4 polling threads: batches hold several rows.
  EXPECT_GT(mean_batch_size(), 1.5) << core_->metrics().expose();
}

TEST_F(GrpcAsyncTest, StopWithBatchedCallsInFlight) {
  // Batches wait up to 1 s for 64 rows: the 8 calls sit in the queue when
  // stop() comes; stop() lets them finish (or gRPC cancels them) and returns.
  serve(64, 1000000);
  grpc::CompletionQueue cq;
  auto calls = send(8, &cq);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto t0 = std::chrono::steady_clock::now();
  server_->stop();
  const double stop_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(stop_s, 10.0);
  ASSERT_EQ(wait_all(8, &cq), 8);
  for (auto& c : calls) {
    auto code = c->status.error_code();
    EXPECT_TRUE(code == grpc::StatusCode::OK || code == grpc::StatusCode::UNAVAILABLE ||
                code == grpc::StatusCode::CANCELLED)
        << code << " " << c->status.error_message();
  }
  // The core's batch thread ran the callbacks after the server was gone? It
  // must not: a second stop() and a fresh server on the same core still work.
  server_->stop();
  server_ = std::make_unique<GrpcServer>(*core_, FrontendOptions{});
  EXPECT_GT(server_->start(), 0);
}

TEST_F(GrpcAsyncTest, StopRightAfterCallsArrive) {
  // Calls racing with stop(): every one ends with a status, none hangs.
  serve(32, 50000);
  for (int round = 0; round < 3; ++round) {
    grpc::CompletionQueue cq;
    auto calls = send(16, &cq);
    std::this_thread::sleep_for(std::chrono::milliseconds(10 * round));
    server_->stop();
    ASSERT_EQ(wait_all(16, &cq), 16);
    server_ = std::make_unique<GrpcServer>(*core_, FrontendOptions{});
    int port = server_->start();
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
    predict_ = tfs::PredictionService::NewStub(channel_);
  }
}

// Bearer tokens and TLS: security_test.cc.

TEST_F(GrpcServerTest, RegisteredAsTheGrpcFrontend) {
  ASSERT_NE(grpc_frontend_factory(), nullptr);
  auto fe = (*grpc_frontend_factory())(*core_, FrontendOptions{});
  EXPECT_EQ(fe->name(), "grpc");
  EXPECT_GT(fe->start(), 0);
  fe->stop();
}

// This process's virtual size (VmSize), KiB.
int64_t grpc_test_vm_size_kib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmSize:", 0) == 0) return std::stoll(line.substr(7));
  return -1;
}

// Reloads run on one admin worker for the server's life. A thread per
// reload that is joined only at stop() keeps its stack mapped after it
// finished (glibc frees an exited thread's stack at join), so a long-lived
// server grew by a stack per reload: 32 reloads were 32 stacks (256 MiB).
TEST_F(GrpcServerTest, ReloadsDoNotKeepAFinishedThreadEach) {
  tfs::ReloadConfigRequest rreq;
  auto* c = rreq.mutable_config()->mutable_model_config_list()->add_config();
  c->set_name("clf");
  c->set_base_path(dir_.path() + "/clf");
  (*c->mutable_version_labels())["stable"] = 1;
  auto reload = [&] {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer adm1n");
    tfs::ReloadConfigResponse r;
    auto s = models_->HandleReloadConfigRequest(&ctx, rreq, &r);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(r.status().error_code(), tensorflow::error::OK);
  };
  reload();  // the worker has run (and has its malloc arena) from here on
  pthread_attr_t attr;
  size_t stack = 0;
  ASSERT_EQ(pthread_getattr_default_np(&attr), 0);
  ASSERT_EQ(pthread_attr_getstacksize(&attr, &stack), 0);
  pthread_attr_destroy(&attr);
  const int kReloads = 32;
  const int64_t before = grpc_test_vm_size_kib();
  ASSERT_GT(before, 0);
  for (int i = 0; i < kReloads; ++i) reload();
  const int64_t grown = grpc_test_vm_size_kib() - before;
  EXPECT_LT(grown, kReloads * static_cast<int64_t>(stack / 1024) / 2)
      << "VmSize grew by " << grown << " KiB over " << kReloads << " reloads (thread stack: " << stack / 1024
      << " KiB)";
  EXPECT_TRUE(core_->wait_until_ready({.name = "clf", .label = "stable"}, 5));
}

// KServe's ModelMetadata lists every version available, newest first, as
// REST's GET /v2/models/{m} does (it listed only the version it resolved).
TEST_F(GrpcServerTest, KServeModelMetadataListsEveryAvailableVersion) {
  save_model(dir_.path() + "/clf/2", 4, 3, "softmax");
  ModelServerConfig cfg = core_->config();
  cfg.models[0].version_policy.kind = VersionPolicy::Kind::kAll;
  core_->reload_config(cfg);
  ASSERT_TRUE(core_->wait_until_ready({.name = "clf", .version = 2}, 30));
  ASSERT_TRUE(core_->wait_until_ready({.name = "clf", .version = 1}, 30));
  auto versions = [&](const std::string& version) {
    grpc::ClientContext ctx;
    inference::ModelMetadataRequest q;
    q.set_name("clf");
    q.set_version(version);
    inference::ModelMetadataResponse r;
    auto s = kserve_->ModelMetadata(&ctx, q, &r);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return std::vector<std::string>(r.versions().begin(), r.versions().end());
  };
  EXPECT_EQ(versions(""), (std::vector<std::string>{"2", "1"}));
  EXPECT_EQ(versions("1"), (std::vector<std::string>{"1"}));
}

// An input with values in `contents` while the request carries
// raw_input_contents: the protocol forbids it (Triton answers
// INVALID_ARGUMENT); kiln answered OK and dropped the contents.
TEST_F(GrpcServerTest, ModelInferRefusesContentsAlongsideRawInputContents) {
  inference::ModelInferRequest q;
  q.set_model_name("clf");
  auto* in = q.add_inputs();
  in->set_name("inputs");
  in->set_datatype("FP32");
  in->add_shape(1);
  in->add_shape(4);
  inference::ModelInferResponse::InferOutputTensor enc;
  std::string bytes;
  to_infer_output("inputs", at::randn({1, 4}), &enc, &bytes);
  q.add_raw_input_contents(bytes);
  {
    grpc::ClientContext ctx;
    inference::ModelInferResponse r;
    auto s = kserve_->ModelInfer(&ctx, q, &r);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  for (int i = 0; i < 4; ++i) in->mutable_contents()->add_fp32_contents(1.0f);
  grpc::ClientContext ctx;
  inference::ModelInferResponse r;
  auto s = kserve_->ModelInfer(&ctx, q, &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("input 'inputs' sets contents, but the request carries raw_input_contents"),
            std::string::npos)
      << s.error_message();
}

}  // namespace
}  // namespace kiln::serving
