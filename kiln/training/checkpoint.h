// Training checkpoints: everything needed to continue a fit() so that the
// result is bit-identical to a run that was never interrupted.
//
// Layout (one directory per checkpoint, published atomically):
//   <backup_dir>/ckpt-000000000007/
//     weights.safetensors    every model variable, keyed by path
//     optimizer.safetensors  Optimizer::state_dict (slots, iterations, lr)
//     metrics.safetensors    metric accumulators at the save point
//     callbacks.safetensors  callbacks' state tensors ("<index>/<name>",
//                            e.g. EarlyStopping's best weights)
//     training_state.json    {"format": "kiln.training_state", epoch, batch,
//                             host_rng, host_rng_epoch_start, torch_rng
//                             (base64 of the CPU generator state),
//                             data_position, stop_training, callbacks
//                             (CallbackList::get_states JSON),
//                             files: {name: {bytes, crc32c}}}
// The directory is assembled under a temporary name and renamed into place
// (AtomicDirectory), so a crash at any moment leaves the previous
// checkpoint valid. The newest `keep` checkpoints are kept. Reading checks
// every file's size and CRC-32C before touching the model; a corrupt or
// truncated checkpoint is skipped (with a warning) in favour of the previous
// one, and FormatError is thrown only when checkpoints exist but none is
// valid.
//
// Thread safety: one writer per backup_dir.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>

#include "kiln/training/train_state.h"

namespace kiln {

namespace models {
class Model;
}

// kiln's host RNG and LibTorch's default CPU generator, as storable values.
std::string host_rng_state();
void set_host_rng_state(const std::string& state);  // FormatError if unparsable
at::Tensor torch_rng_state();
void set_torch_rng_state(const at::Tensor& state);
// The generator state of GPU `device` (undefined for the CPU), and its
// restore (nothing for the CPU or an undefined state).
at::Tensor cuda_rng_state(const at::Device& device);
void set_cuda_rng_state(const at::Device& device, const at::Tensor& state);

// Writes `point` (including its metric_variables, in
// TrainState::all_metrics() order) with the model's weights and optimizer
// state, then removes all but the newest `keep` checkpoints. Returns the
// published directory.
std::string write_training_checkpoint(const std::string& backup_dir, models::Model& model, const ResumePoint& point,
                                      int keep = 2);

// Restores the newest valid checkpoint into `model` (weights, optimizer
// state) and returns its resume point; nullopt when there is none.
std::optional<ResumePoint> restore_training_checkpoint(const std::string& backup_dir, models::Model& model);

// Checkpoint directories in backup_dir, oldest first.
std::vector<std::string> list_training_checkpoints(const std::string& backup_dir);

}  // namespace kiln
