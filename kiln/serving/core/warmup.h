// Warmup (TF Serving's SavedModel warmup): before a new version takes
// traffic, replay the requests in <version>/assets/extra/warmup_requests.jsonl
// against it, so its first real requests do not pay for first-call costs
// (allocations, kernel choices, page faults on the weights).
//
//   int n = replay_warmup(*servable, "/models/mnist/3");  // 0 without the file
//
// Each non-blank line is a TF Serving REST predict body
// ({"instances": ...} or {"inputs": ...}, optional "signature_name"),
// decoded by the shared request codec (kiln/serving/codec/rest_codec.h), not by a
// front end. kiln's file replaces TF Serving's TFRecord of PredictionLog
// protos; the intent is the same. A line that fails to decode or run throws
// FormatError naming the file and line, and the version fails to load.
// Thread safety: uses only `servable`, which must be safe to call.
#pragma once

#include <string>

#include "kiln/serving/core/servable.h"

namespace kiln::serving {

// Replays the version directory's warmup file; returns the requests run.
int replay_warmup(Servable& servable, const std::string& version_dir);

}  // namespace kiln::serving
