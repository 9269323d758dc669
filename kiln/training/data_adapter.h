// How fit()/evaluate()/predict() see their data: batches of (x, y,
// sample_weight) from tensors or from a Dataset, one pass per epoch.
//
// Tensors: batch_size rows at a time, in a fresh permutation each epoch when
// shuffling (drawn from kiln's host RNG, so set_random_seed repeats it and
// a checkpoint can redraw it), class weights folded into sample weights.
// Datasets: elements are already batched; an element is (inputs...,
// targets..., [sample_weight]) split by the model's input and output
// counts; each epoch is a new pass iterator(epoch) (deterministic per
// epoch), truncated to steps_per_epoch.
//
// Internal to kiln/training; not a stable API.
#pragma once

#include <map>
#include <memory>
#include <optional>

#include "kiln/data/dataset.h"
#include "kiln/models/fit_args.h"

namespace kiln {

namespace models {
class Model;
}

// Batch: kiln/models/fit_args.h (what Model::train_step receives).

class EpochIterator {
 public:
  virtual ~EpochIterator() = default;
  virtual std::optional<Batch> next() = 0;
  // Skips n batches (resume mid-epoch).
  virtual void skip(int64_t n) = 0;
};

class DataAdapter {
 public:
  virtual ~DataAdapter() = default;
  // Batches per pass: >= 0, or kUnknownCardinality / kInfiniteCardinality.
  virtual int64_t num_batches() const = 0;
  // Starts the pass for `epoch` (tensors: draws the shuffle now).
  virtual std::unique_ptr<EpochIterator> begin_epoch(int epoch) = 0;
  // The inputs of a first batch (to build the model before training).
  virtual Tensors sample_inputs() const = 0;
};

// x: one tensor per input; y may be empty (predict). ValueError names the
// lengths when x, y and sample_weight disagree.
std::unique_ptr<DataAdapter> make_tensor_adapter(const Tensors& x, const Tensors& y, const at::Tensor& sample_weight,
                                                 int64_t batch_size, bool shuffle,
                                                 const std::map<int64_t, double>& class_weight = {});

// num_inputs / num_outputs split each element (num_outputs 0: inputs only).
std::unique_ptr<DataAdapter> make_dataset_adapter(const data::Dataset& ds, size_t num_inputs, size_t num_outputs,
                                                  const std::map<int64_t, double>& class_weight = {});

// Per-sample weights class_weight[class of y] (class from integer labels of
// shape (N,) / (N,1), or the argmax of one-hot (N,C) targets); 1 for classes
// not in the map.
at::Tensor class_weights_for(const at::Tensor& y, const std::map<int64_t, double>& class_weight);

// Data parallel under the active distribution (identity without one, or
// with one replica). Splitting (Distribution::split_batches): each replica
// sees its share of every batch of `inner` (rows split as evenly as
// possible, in order: replica r's rows follow replica r-1's), so all
// replicas run the same number of steps; a batch with fewer rows than
// replicas is dropped. Not splitting: each replica's batches are its own,
// and the replicas agree at every batch to stop at the shortest one's end
// (a collective per batch), so uneven inputs never deadlock.
std::unique_ptr<DataAdapter> shard_batches(std::unique_ptr<DataAdapter> inner);

// The device `model` computes on: where its first variable lives, or
// default_device() while it has none (an unbuilt model builds there).
at::Device model_device(const models::Model& model);

// Each tensor on `device`: the same tensor when it is already there (so on
// the CPU this costs a comparison per tensor), else a copy.
Tensors to_device(const Tensors& ts, const at::Device& device);

// The batches of `inner` on `device`. On the CPU, `inner` itself (nothing
// changes). On a GPU, the next batch is put in page-locked memory and copied
// on a side stream while the current step runs, and the step's stream waits
// for the copy on the GPU, not on the host (tf.data's prefetch_to_device,
// PyTorch's pin_memory with non_blocking copies).
std::unique_ptr<DataAdapter> prefetch_to_device(std::unique_ptr<DataAdapter> inner, const at::Device& device);

// Rows [begin, end) of each tensor.
Tensors slice_rows(const Tensors& ts, int64_t begin, int64_t end);

}  // namespace kiln
