// check_predict_request_options: each of predict.proto's newer fields is
// either ignored (hints) or refused by name (what kiln cannot do).
#include "kiln/serving/codec/predict_options.h"

#include <gtest/gtest.h>

#include "kiln/core/error.h"

namespace kiln::serving {
namespace {

using tensorflow::serving::PredictRequest;
using tensorflow::serving::PredictStreamedOptions;

std::string predict_options_error(const PredictRequest& r) {
  try {
    check_predict_request_options(r);
  } catch (const ValueError& e) {
    return e.what();
  }
  return "";
}

TEST(PredictOptions, HintsAreAccepted) {
  PredictRequest r;
  EXPECT_EQ(predict_options_error(r), "");
  r.set_client_id("product-7");
  r.mutable_predict_streamed_options()->set_request_state(PredictStreamedOptions::NONE);  // a whole request
  auto* o = r.mutable_request_options();
  o->set_client_id("product-7");
  o->set_deterministic_mode(PredictRequest::RequestOptions::FIXED_DECODER_SLOT);
  o->set_max_cache_length(128);
  o->mutable_handshake()->set_estimated_payload_bytes(1 << 20);
  o->set_return_all_stoptokens(false);
  EXPECT_EQ(predict_options_error(r), "");
}

TEST(PredictOptions, StreamedSplitsAreRefusedByName) {
  PredictRequest r;
  r.mutable_predict_streamed_options()->set_request_state(PredictStreamedOptions::SPLIT);
  EXPECT_NE(predict_options_error(r).find("predict_streamed_options.request_state is SPLIT: split requests belong to "
                                          "TF Serving's PredictStreamed RPC"),
            std::string::npos);
  PredictRequest d;
  (*d.mutable_predict_streamed_options()->mutable_split_dimensions())["x"] = 0;
  EXPECT_NE(predict_options_error(d).find("split_dimensions names 1 input(s)"), std::string::npos);
}

TEST(PredictOptions, DecodingOptionsAreRefusedByName) {
  PredictRequest a;
  a.mutable_request_options()->set_return_additional_arrays_from_prefill(true);
  EXPECT_NE(predict_options_error(a).find("return_additional_arrays_from_prefill is true"), std::string::npos);
  PredictRequest b;
  b.mutable_request_options()->add_return_stoptokens(2);  // a token id
  EXPECT_NE(predict_options_error(b).find("return_stoptokens names 1 stop token(s)"), std::string::npos);
  PredictRequest c;
  c.mutable_request_options()->set_return_all_stoptokens(true);
  EXPECT_NE(predict_options_error(c).find("return_all_stoptokens is true"), std::string::npos);
}

// A PredictRequest from a client built with upstream's predict.proto keeps
// its newer fields through kiln's parser (they are known fields now, not
// unknown ones), and its JSON names are upstream's.
TEST(PredictOptions, NewerFieldsRoundTrip) {
  PredictRequest r;
  r.set_client_id("c");
  r.mutable_request_options()->set_max_cache_length(7);
  PredictRequest back;
  ASSERT_TRUE(back.ParseFromString(r.SerializeAsString()));
  EXPECT_EQ(back.client_id(), "c");
  EXPECT_EQ(back.request_options().max_cache_length(), 7);
  EXPECT_TRUE(back.GetReflection()->GetUnknownFields(back).empty());
}

}  // namespace
}  // namespace kiln::serving
