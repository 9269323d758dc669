#include "kiln/serving/codec/predict_options.h"

#include <string>

#include "kiln/core/error.h"

namespace kiln::serving {

void check_predict_request_options(const tensorflow::serving::PredictRequest& request) {
  if (request.has_predict_streamed_options()) {
    const auto& s = request.predict_streamed_options();
    if (s.request_state() != tensorflow::serving::PredictStreamedOptions::NONE)
      throw ValueError("PredictRequest.predict_streamed_options.request_state is " +
                       tensorflow::serving::PredictStreamedOptions::RequestState_Name(s.request_state()) +
                       ": split requests belong to TF Serving's PredictStreamed RPC, which kiln does not offer; send "
                       "the whole request to Predict without predict_streamed_options");
    if (!s.split_dimensions().empty())
      throw ValueError("PredictRequest.predict_streamed_options.split_dimensions names " +
                       std::to_string(s.split_dimensions().size()) +
                       " input(s): split requests belong to TF Serving's PredictStreamed RPC, which kiln does not "
                       "offer; send the whole request to Predict without predict_streamed_options");
  }
  if (!request.has_request_options()) return;
  const auto& o = request.request_options();
  const std::string why = ": kiln serves models that do not decode tokens; leave request_options unset";
  if (o.return_additional_arrays_from_prefill())
    throw ValueError("PredictRequest.request_options.return_additional_arrays_from_prefill is true" + why);
  if (o.return_stoptokens_size() > 0)
    throw ValueError("PredictRequest.request_options.return_stoptokens names " +
                     std::to_string(o.return_stoptokens_size()) + " stop token(s)" + why);
  if (o.return_all_stoptokens()) throw ValueError("PredictRequest.request_options.return_all_stoptokens is true" + why);
}

}  // namespace kiln::serving
