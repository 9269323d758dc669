// Collectives between the ranks of a job, through LibTorch's c10d: the
// rendezvous is a c10d::TCPStore served by rank 0 at MASTER_ADDR:MASTER_PORT,
// the collectives a c10d::ProcessGroupGloo for CPU tensors and, when every
// rank computes on a GPU of its own, a c10d::ProcessGroupNCCL for GPU
// tensors (nccl.h: choose_collective_backend; otherwise GPU tensors go
// through Gloo too). kiln writes no socket code of its own. One addition:
// ranks that all share one host sum their CPU gradient buckets through a
// shared-memory segment (TCP loopback is ~10x slower than a memory copy), as
// NCCL does within a host.
//
//   auto c = Collectives::connect(resolve_cluster(), {.timeout_seconds = 300});
//   std::vector<at::Tensor> t = {grad};
//   c->all_reduce_sum(t);
//
// Every rank calls the same collectives in the same order. A collective
// that does not complete within the timeout (a rank died or hangs) throws
// kiln::Error naming this rank, the collective and the cause, so no rank
// waits forever.
//
// Thread safety: one thread issues collectives; the waits returned by
// all_reduce_sum_async may be called from that thread only.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/distribute/cluster.h"

namespace kiln::distribute {

struct CollectiveOptions {
  // Rendezvous and per-collective timeout; 0: $KILN_COLLECTIVE_TIMEOUT
  // (seconds) if set, else 300.
  double timeout_seconds = 0;
  // Where this rank computes. A GPU: the group agrees on NCCL or Gloo for
  // GPU tensors when it connects (a collective).
  at::Device device{at::kCPU};
  // "auto", "nccl" or "gloo" for GPU tensors; "": $KILN_COLLECTIVE_BACKEND
  // if set, else auto.
  std::string backend;
};

class Collectives {
 public:
  // Joins the group described by `cluster` (blocks until every rank has
  // joined, or the timeout). Error names the master address on failure.
  static std::shared_ptr<Collectives> connect(const ClusterSpec& cluster, const CollectiveOptions& o = {});
  ~Collectives();

  int rank() const { return rank_; }
  int size() const { return size_; }
  double timeout_seconds() const { return timeout_s_; }

  // Element-wise sums across ranks, in place. Tensors of any shape and of
  // floating or integer dtypes; they travel as one flat buffer per dtype.
  void all_reduce_sum(std::vector<at::Tensor>& tensors);
  // One contiguous tensor, started now; the returned function waits.
  // bfloat16 travels as an all-gather (Gloo has no bfloat16 sum) added up
  // in float32 in rank order: half the bytes of a float32 all-reduce for 2
  // ranks, as many for 4, more beyond.
  std::function<void()> all_reduce_sum_async(at::Tensor flat);
  // Rank `root`'s values into everyone's tensors, in place.
  void broadcast(std::vector<at::Tensor>& tensors, int root = 0);
  void barrier();

  // --- Groups of ranks (ModelParallel's mesh axes) ----------------------
  // A group of `ranks` (this rank among them; every rank of the job calls
  // subgroup() with the same `tag` for the groups it belongs to, in the same
  // order). Its collectives reach only those ranks; its rank() is this
  // rank's index in `ranks`. It shares this group's rendezvous store and its
  // backend for GPU tensors (no shared-memory path).
  std::shared_ptr<Collectives> subgroup(const std::vector<int>& ranks, const std::string& tag);
  // Every rank's `t` (same shape on all), in rank order.
  std::vector<at::Tensor> all_gather(const at::Tensor& t);

  // --- sharded optimizer state (ZeRO) ---
  // The element-wise sum of one contiguous tensor across ranks into rank
  // `root`'s copy, started now; the returned function waits. The other
  // ranks' tensors are left unspecified. float32 on one host: through the
  // shared-memory segment (as all_reduce_sum_async, but only `root` copies
  // the sum out); otherwise Gloo's reduce; bfloat16 as all_reduce_sum_async.
  std::function<void()> reduce_sum_async(at::Tensor flat, int root);

  // Whether float32 gradient sums go through shared memory: every rank on
  // this host (LOCAL_WORLD_SIZE == WORLD_SIZE) and KILN_SHM_ALLREDUCE is not
  // "0". Otherwise Gloo.
  bool shared_memory() const;
  // "nccl" when GPU tensors go through NCCL, else "gloo".
  std::string gpu_backend() const;

 private:
  void connect_shared_memory(const ClusterSpec& cluster);
  void connect_gpu_backend(const CollectiveOptions& o, const std::string& host);
  struct Impl;
  Collectives() = default;
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, size_ = 1;
  double timeout_s_ = 300;
};

// The timeout in force for `o` (see CollectiveOptions).
double collective_timeout_seconds(const CollectiveOptions& o);

}  // namespace kiln::distribute
