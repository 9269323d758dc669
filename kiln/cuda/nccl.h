// NCCL collectives between GPUs through LibTorch's c10d::ProcessGroupNCCL
// (kiln writes no collective of its own). Every rank calls this with the
// same store (a c10d::TCPStore served by rank 0, as kiln::distribute's
// rendezvous) and one GPU per rank.
//
//   auto pg = kiln::cuda::make_nccl_backend(store, rank, size, /*device=*/local_rank);
//   std::vector<at::Tensor> t = {grad};   // on cuda:local_rank
//   pg->allreduce(t)->wait();
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <string>

namespace kiln::cuda {

// A process group of `size` ranks in which this one is `rank`, using GPU
// `device`. Collectives that do not finish within `timeout_seconds` abort
// with an error naming the rank. Throws kiln::ValueError when `device` is
// not a GPU of this machine.
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    int device, double timeout_seconds = 300);

// NCCL's version as LibTorch was built with it ("2.28.9").
std::string nccl_version();

}  // namespace kiln::cuda
