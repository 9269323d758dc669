// NCCL collectives between GPUs through LibTorch's c10d::ProcessGroupNCCL
// (kiln writes no collective of its own), and the rule that picks NCCL or
// Gloo for a job's GPU tensors. Collectives (collectives.h) uses both; a
// program may build a group itself:
//
//   auto pg = kiln::distribute::make_nccl_backend(store, rank, size, /*device=*/local_rank);
//   std::vector<at::Tensor> t = {grad};   // on cuda:local_rank
//   pg->allreduce(t)->wait();
//
// Present in every build: where LibTorch has no NCCL (a CPU-only LibTorch)
// make_nccl_backend throws and nccl_available() is false.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <string>
#include <vector>

namespace kiln::distribute {

// A process group of `size` ranks in which this one is `rank`, using GPU
// `device`. Collectives that do not finish within `timeout_seconds` abort
// with an error naming the rank. Throws kiln::ValueError when `device` is
// not a GPU of this machine, or when LibTorch was built without NCCL.
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    int device, double timeout_seconds = 300);

// Whether this LibTorch has c10d's NCCL backend.
bool nccl_available();
// NCCL's version as LibTorch was built with it ("2.28.9"); "" without NCCL.
std::string nccl_version();

// Where one rank computes: its host (any identifier equal for the ranks of
// one host, e.g. the address it reaches the master from) and its device.
struct RankDevice {
  std::string host;
  at::Device device{at::kCPU};
};

// The backend for a job's GPU tensors, "nccl" or "gloo" (CPU tensors always
// go through Gloo). `ranks`: every rank's RankDevice, in rank order (each
// rank computes the same answer from the same list). `requested`: "auto"
// (or ""), "nccl" or "gloo", from KILN_COLLECTIVE_BACKEND. auto picks NCCL
// when every rank computes on a GPU of its own (NCCL refuses two ranks on
// one GPU) and LibTorch has NCCL; otherwise Gloo, which takes CUDA tensors
// too. Throws kiln::ValueError for "nccl" where it cannot run, naming the
// ranks that share a GPU or compute on the CPU, and the fix.
std::string choose_collective_backend(const std::vector<RankDevice>& ranks, const std::string& requested,
                                      bool nccl_built = nccl_available());

}  // namespace kiln::distribute
