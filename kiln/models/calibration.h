// Post-training static int8 quantization (the seeds' TFLite "full integer"
// recipe, on kiln's abs-max scheme): quantize, run a representative
// calibration set, fix each int8 layer's input scale.
//
//   model->quantize("int8");
//   calibrate(*model, {x_calibration}, {.method = "percentile", .percentile = 99.99});
//   model->save(dir);      // the policy says "static"; load_model restores the scales
//
// Ranges: "minmax" takes max |x| over every calibration input of a layer;
// "percentile" the given percentile of |x| (robust to outliers; computed on
// a bounded sample of the inputs). Inputs beyond the range saturate at
// +-127 at run time.
//
// Thread safety: no other thread may run the model's quantized layers
// while calibrate() runs.
#pragma once

#include "kiln/models/model.h"
#include "kiln/quantization/kernels.h"

namespace kiln {

// Runs `x` through the model in batches of `batch_size` with calibration on;
// then every int8 layer fixes its input scale. StateError when the model has
// no int8 layer (call quantize("int8") first); ValueError for a bad method.
void calibrate(models::Model& model, const Tensors& x, const quantization::CalibrationOptions& options,
               int64_t batch_size = 256);

}  // namespace kiln
