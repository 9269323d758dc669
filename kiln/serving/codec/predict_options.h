// PredictRequest's newer fields (predict.proto 5-7: predict_streamed_options,
// client_id, request_options) and what kiln does with each. A client built
// from TF Serving's current predict.proto may set them; kiln ignores those
// that are hints it trivially honours and refuses those asking for something
// it cannot do, naming the field, rather than answering as if it had.
//
//   field                                          kiln
//   5  predict_streamed_options, unsplit           ignored (request_state NONE,
//      (request_state NONE, no split_dimensions)   no split: a whole request)
//   5  ... request_state SPLIT/END_SPLIT/CANCEL,   INVALID_ARGUMENT: that is the
//      or split_dimensions                         PredictStreamed RPC's protocol
//   6  client_id                                   ignored (placement hint)
//   7  request_options.client_id                   ignored (placement hint)
//   7  request_options.deterministic_mode          ignored (kiln has no decoder
//                                                  slots; nothing to fix)
//   7  request_options.max_cache_length            ignored (no KV cache)
//   7  request_options.handshake                   ignored (size hint)
//   7  request_options.return_additional_arrays_   INVALID_ARGUMENT when true
//      from_prefill                                (no prefill stage)
//   7  request_options.return_stoptokens (any),    INVALID_ARGUMENT (kiln does not
//      return_all_stoptokens = true                decode tokens)
//
// Call it once per Predict request, before decoding the inputs (the gRPC
// front end; REST predict bodies have no such fields).
//
//   check_predict_request_options(request);   // throws ValueError
//
// Errors: ValueError (INVALID_ARGUMENT at the server's edge) whose message
// names the field, its value and what to do instead.
// Thread safety: a pure function.
#pragma once

#include "tensorflow_serving/apis/predict.pb.h"

namespace kiln::serving {

void check_predict_request_options(const tensorflow::serving::PredictRequest& request);

}  // namespace kiln::serving
