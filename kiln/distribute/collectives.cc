// Debian's c10d headers need USE_C10D_GLOO to declare ProcessGroupGloo. It
// is defined here, after the precompiled header, and only in this file
// (outside the unity batch), so every other file keeps the shared PCH.
#define USE_C10D_GLOO 1
#include "kiln/distribute/collectives.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <netdb.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <tuple>

#include "kiln/core/error.h"
#include "kiln/distribute/nccl.h"

namespace kiln::distribute {

namespace {

// Ranks that share a host sum float32 buffers through one POSIX shared
// memory segment instead of Gloo's TCP loopback (which moves ~0.8 GB/s
// here against ~10 GB/s for a memory copy), as NCCL does for the GPUs of one
// host. Each chunk: every rank copies its values into its slot; barrier;
// rank r adds up its 1/N of the chunk over all slots, in rank order (so
// every rank gets the same bits); barrier; every rank copies the result
// out; barrier. Barriers are per-rank sequence numbers in the segment,
// waited on with futexes (no spinning against the computing threads), with
// the collective timeout. The work runs on one thread per process, in the
// order it was submitted, which is the same on every rank.
class ShmAllReduce {
 public:
  static constexpr int kMaxRanks = 64;
  static constexpr int64_t kChunk = 1 << 20;  // floats per round (4 MB)

  ShmAllReduce(void* base, size_t bytes, int rank, int size, double timeout_s)
      : base_(base), bytes_(bytes), rank_(rank), size_(size), timeout_s_(timeout_s) {
    worker_ = std::thread([this] { run(); });
  }
  ~ShmAllReduce() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    abort_ = true;  // a barrier waiting for a dead rank gives up within 100 ms
    cv_.notify_all();
    worker_.join();
    ::munmap(base_, bytes_);
  }
  static size_t segment_bytes(int size) { return header_bytes() + sizeof(float) * kChunk * (size + 1); }

  // Queues a sum of `flat` (contiguous float32) into itself; with root >= 0
  // only rank `root` copies the sum out (a reduce).
  std::shared_future<void> submit(at::Tensor flat, int root = -1) {
    std::promise<void> p;
    auto f = p.get_future().share();
    {
      std::lock_guard<std::mutex> l(mu_);
      queue_.push_back({std::move(flat), root, std::move(p)});
    }
    cv_.notify_one();
    return f;
  }

 private:
  struct alignas(64) Seq {
    std::atomic<uint32_t> value;
  };
  static size_t header_bytes() { return sizeof(Seq) * kMaxRanks; }
  Seq* seq(int r) const { return reinterpret_cast<Seq*>(base_) + r; }
  float* slot(int r) const {
    return reinterpret_cast<float*>(static_cast<char*>(base_) + header_bytes()) + static_cast<int64_t>(r) * kChunk;
  }
  float* result() const { return slot(size_); }

  void barrier() {
    const uint32_t g = ++generation_;
    seq(rank_)->value.store(g, std::memory_order_release);
    ::syscall(SYS_futex, &seq(rank_)->value, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      for (int spin = 0;; ++spin) {
        const uint32_t v = seq(q)->value.load(std::memory_order_acquire);
        if (static_cast<int32_t>(v - g) >= 0) break;
        if (spin < 64) continue;
        if (abort_) throw Error("rank " + std::to_string(rank_) + ": shared-memory all-reduce abandoned");
        if (std::chrono::steady_clock::now() > deadline)
          throw Error("rank " + std::to_string(rank_) + ": gradient all-reduce (shared memory) across " +
                      std::to_string(size_) + " ranks failed: rank " + std::to_string(q) +
                      " did not arrive (another rank died or hangs; collective timeout " +
                      std::to_string(static_cast<long>(timeout_s_)) + " s, set by KILN_COLLECTIVE_TIMEOUT)");
        timespec ts{0, 100 * 1000 * 1000};  // re-check the deadline every 100 ms
        ::syscall(SYS_futex, &seq(q)->value, FUTEX_WAIT, v, &ts, nullptr, 0);
      }
    }
  }

  void all_reduce(float* data, int64_t n, int root) {
    for (int64_t off = 0; off < n; off += kChunk) {
      const int64_t m = std::min(kChunk, n - off);
      std::memcpy(slot(rank_), data + off, sizeof(float) * m);
      barrier();
      const int64_t lo = m * rank_ / size_, hi = m * (rank_ + 1) / size_;
      float* out = result();
      const float* first = slot(0);
      for (int64_t i = lo; i < hi; ++i) out[i] = first[i];
      for (int q = 1; q < size_; ++q) {
        const float* in = slot(q);
        for (int64_t i = lo; i < hi; ++i) out[i] += in[i];
      }
      barrier();
      if (root < 0 || root == rank_) std::memcpy(data + off, out, sizeof(float) * m);
      barrier();
    }
  }

  void run() {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      try {
        if (failed_) std::rethrow_exception(failed_);
        all_reduce(job.flat.data_ptr<float>(), job.flat.numel(), job.root);
        job.done.set_value();
      } catch (...) {
        failed_ = std::current_exception();  // the segment's barriers are out of step now
        job.done.set_exception(failed_);
      }
    }
  }

  void* base_;
  size_t bytes_;
  int rank_, size_;
  double timeout_s_;
  uint32_t generation_ = 0;
  std::atomic<bool> abort_{false};
  std::exception_ptr failed_;
  std::mutex mu_;
  std::condition_variable cv_;
  struct Job {
    at::Tensor flat;
    int root = -1;  // -1: every rank gets the sum
    std::promise<void> done;
  };
  std::deque<Job> queue_;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace

struct Collectives::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
  std::unique_ptr<ShmAllReduce> shm;       // every rank on this host: float32 sums
  c10::intrusive_ptr<c10d::Backend> nccl;  // GPU tensors, when every rank has a GPU of its own
  at::Device device{at::kCPU};

  // The group that carries `t`: NCCL for a GPU tensor when there is one.
  c10d::Backend& backend_for(const at::Tensor& t) const {
    if (nccl && t.is_cuda()) return *nccl;
    return *pg;
  }
};

namespace {

std::string first_line(std::string s) {
  auto nl = s.find('\n');
  if (nl != std::string::npos) s.resize(nl);
  return s;
}

std::string cause_of(const std::exception& e) {
  if (auto* c = dynamic_cast<const c10::Error*>(&e)) return first_line(c->what_without_backtrace());
  return first_line(e.what());
}

// The address of this host that routes to `master` (what Gloo binds to):
// the kernel's choice for a UDP "connection" to it (no packet is sent).
// GLOO_SOCKET_IFNAME (PyTorch's variable) picks an interface instead.
std::string local_address_towards(const std::string& master, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(master.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res)
    throw ValueError("MASTER_ADDR " + master + " does not resolve to an IPv4 address; set it to rank 0's host");
  std::string out = "127.0.0.1";
  int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  if (fd >= 0) {
    if (::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
      sockaddr_in me{};
      socklen_t len = sizeof(me);
      char buf[INET_ADDRSTRLEN] = {0};
      if (::getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0 &&
          ::inet_ntop(AF_INET, &me.sin_addr, buf, sizeof(buf)))
        out = buf;
    }
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return out;
}

void wait_for(const c10::intrusive_ptr<c10d::Work>& work, const char* what, int rank, int size, double timeout_s) {
  try {
    work->wait();
  } catch (const std::exception& e) {
    throw Error("rank " + std::to_string(rank) + ": " + what + " across " + std::to_string(size) +
                " ranks failed: " + cause_of(e) + " (another rank died or hangs; collective timeout " +
                std::to_string(static_cast<long>(timeout_s)) + " s, set by KILN_COLLECTIVE_TIMEOUT)");
  }
}

// Groups `tensors` by device and dtype into flat buffers (index lists per
// group, in an order every rank computes alike from the same list).
using GroupKey = std::tuple<int, int, at::ScalarType>;  // device type, index, dtype
std::map<GroupKey, std::vector<size_t>> by_dtype(const std::vector<at::Tensor>& tensors) {
  std::map<GroupKey, std::vector<size_t>> groups;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    if (!t.defined() || t.numel() == 0) continue;
    groups[{static_cast<int>(t.device().type()), static_cast<int>(t.device().index()), t.scalar_type()}].push_back(i);
  }
  return groups;
}

at::Tensor flatten(const std::vector<at::Tensor>& tensors, const std::vector<size_t>& idx) {
  std::vector<at::Tensor> parts;
  parts.reserve(idx.size());
  for (size_t i : idx) parts.push_back(tensors[i].detach().reshape({-1}));
  return at::cat(parts).contiguous();
}

void unflatten(const at::Tensor& flat, std::vector<at::Tensor>& tensors, const std::vector<size_t>& idx) {
  at::NoGradGuard ng;
  int64_t off = 0;
  for (size_t i : idx) {
    const int64_t n = tensors[i].numel();
    tensors[i].copy_(flat.narrow(0, off, n).view(tensors[i].sizes()));
    off += n;
  }
}

}  // namespace

double collective_timeout_seconds(const CollectiveOptions& o) {
  if (o.timeout_seconds > 0) return o.timeout_seconds;
  if (const char* v = std::getenv("KILN_COLLECTIVE_TIMEOUT")) {
    char* end = nullptr;
    const double s = std::strtod(v, &end);
    if (end == v || *end != '\0' || !(s > 0))
      throw ValueError(std::string("KILN_COLLECTIVE_TIMEOUT must be a positive number of seconds. Received: ") + v);
    return s;
  }
  return 300;
}

std::shared_ptr<Collectives> Collectives::connect(const ClusterSpec& cluster, const CollectiveOptions& o) {
  std::shared_ptr<Collectives> c(new Collectives());
  c->impl_ = std::make_unique<Impl>();
  c->rank_ = cluster.rank;
  c->size_ = cluster.world_size;
  c->timeout_s_ = collective_timeout_seconds(o);
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(c->timeout_s_ * 1000));
  const std::string where = cluster.master_addr + ":" + std::to_string(cluster.master_port);
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(cluster.master_port);
    so.isServer = cluster.rank == 0;
    so.numWorkers = static_cast<size_t>(cluster.world_size);
    so.waitWorkers = true;
    so.timeout = timeout;
    c->impl_->store = c10::make_intrusive<c10d::TCPStore>(cluster.master_addr, so);
  } catch (const std::exception& e) {
    throw Error("rank " + std::to_string(cluster.rank) + ": cannot meet the other " +
                std::to_string(cluster.world_size - 1) + " ranks at " + where + " (" + cause_of(e) +
                "); check MASTER_ADDR/MASTER_PORT and that every rank was started");
  }
  try {
    auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"))
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
    else
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(
          local_address_towards(cluster.master_addr, cluster.master_port)));
    opts->threads = 2;
    c->impl_->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(c->impl_->store, cluster.rank, cluster.world_size, opts);
  } catch (const std::exception& e) {
    throw Error("rank " + std::to_string(cluster.rank) + ": cannot connect the Gloo process group through " + where +
                " (" + cause_of(e) + ")");
  }
  c->connect_shared_memory(cluster);
  c->connect_gpu_backend(o, local_address_towards(cluster.master_addr, cluster.master_port));
  return c;
}

// Every rank's host and device, through Gloo (each rank decides alike from
// the same list); NCCL joins when choose_collective_backend says so.
void Collectives::connect_gpu_backend(const CollectiveOptions& o, const std::string& host) {
  impl_->device = o.device;
  const int64_t host_id = static_cast<int64_t>(std::hash<std::string>()(host) >> 1);
  at::Tensor mine =
      at::tensor({host_id, static_cast<int64_t>(o.device.type()), static_cast<int64_t>(o.device.index())}, at::kLong);
  std::vector<RankDevice> ranks;
  for (const at::Tensor& t : all_gather(mine))
    ranks.push_back(
        {std::to_string(t[0].item<int64_t>()), at::Device(static_cast<at::DeviceType>(t[1].item<int64_t>()),
                                                          static_cast<at::DeviceIndex>(t[2].item<int64_t>()))});
  std::string requested = o.backend;
  if (requested.empty())
    if (const char* env = std::getenv("KILN_COLLECTIVE_BACKEND")) requested = env;
  std::string backend;
  try {
    backend = choose_collective_backend(ranks, requested);
  } catch (const ValueError& e) {
    throw ValueError("rank " + std::to_string(rank_) + ": " + e.what());
  }
  if (backend != "nccl") return;
  impl_->nccl = make_nccl_backend(c10::make_intrusive<c10d::PrefixStore>("kiln/nccl", impl_->store), rank_, size_,
                                  o.device.index(), timeout_s_);
}

std::string Collectives::gpu_backend() const { return impl_->nccl ? "nccl" : "gloo"; }

void Collectives::connect_shared_memory(const ClusterSpec& cluster) {
  const char* off = std::getenv("KILN_SHM_ALLREDUCE");
  if ((off && std::string(off) == "0") || cluster.local_world_size != size_ || size_ > ShmAllReduce::kMaxRanks) return;
  // Rank 0 makes the segment and publishes its name ("" when it cannot);
  // the others map it; once all have, the name goes (the memory lives
  // until the last rank exits, however it exits).
  const size_t bytes = ShmAllReduce::segment_bytes(size_);
  std::string name;
  int fd = -1;
  if (rank_ == 0) {
    std::random_device rd;
    name = "/kiln-allreduce-" + std::to_string(::getpid()) + "-" + std::to_string(rd());
    fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 || ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)) != 0) {
      if (fd >= 0) ::close(fd), ::shm_unlink(name.c_str());
      fd = -1;
      name.clear();
    }
    impl_->store->set("kiln/shm_allreduce", std::vector<uint8_t>(name.begin(), name.end()));
  } else {
    auto v = impl_->store->get("kiln/shm_allreduce");
    name.assign(v.begin(), v.end());
    if (!name.empty()) fd = ::shm_open(name.c_str(), O_RDWR, 0600);
  }
  void* base = MAP_FAILED;
  if (fd >= 0) {
    base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
  }
  // Every rank must have it, or none uses it.
  std::vector<at::Tensor> ok = {at::full({1}, base != MAP_FAILED ? 1 : 0, at::kInt)};
  all_reduce_sum(ok);
  if (rank_ == 0 && !name.empty()) ::shm_unlink(name.c_str());
  if (ok[0].item<int>() != size_) {
    if (base != MAP_FAILED) ::munmap(base, bytes);
    return;
  }
  impl_->shm = std::make_unique<ShmAllReduce>(base, bytes, rank_, size_, timeout_s_);
}

bool Collectives::shared_memory() const { return impl_->shm != nullptr; }

Collectives::~Collectives() = default;

void Collectives::all_reduce_sum(std::vector<at::Tensor>& tensors) {
  for (auto& [key, idx] : by_dtype(tensors)) {
    std::vector<at::Tensor> flat = {flatten(tensors, idx)};
    wait_for(impl_->backend_for(flat[0]).allreduce(flat), "all-reduce", rank_, size_, timeout_s_);
    unflatten(flat[0], tensors, idx);
  }
}

std::function<void()> Collectives::all_reduce_sum_async(at::Tensor flat) {
  if (flat.scalar_type() == at::kBFloat16 && !(impl_->nccl && flat.is_cuda())) {
    // Gloo (LibTorch 1.13) has no bfloat16 sum: gather every rank's bytes
    // (viewed as float16: a gather does no arithmetic) and add them here in
    // float32, in rank order, so every rank gets the same result.
    std::vector<at::Tensor> in = {flat.view(at::kHalf)};
    std::vector<std::vector<at::Tensor>> out(1);
    for (int r = 0; r < size_; ++r) out[0].push_back(at::empty_like(in[0]));
    auto work = impl_->pg->allgather(out, in);
    return [work, out, flat, r = rank_, n = size_, t = timeout_s_]() mutable {
      wait_for(work, "gradient all-gather (bfloat16)", r, n, t);
      at::Tensor sum = out[0][0].view(at::kBFloat16).to(at::kFloat);
      for (size_t i = 1; i < out[0].size(); ++i) sum.add_(out[0][i].view(at::kBFloat16).to(at::kFloat));
      flat.copy_(sum);
    };
  }
  if (impl_->shm && flat.scalar_type() == at::kFloat && flat.is_contiguous() && flat.device().is_cpu()) {
    auto done = impl_->shm->submit(flat);
    return [done] { done.get(); };
  }
  // NCCL: the sum runs on NCCL's own stream, after the work queued so far
  // on the current one; wait() makes the waiting thread's current stream
  // wait for it (the host does not block), as PyTorch's DDP buckets do.
  std::vector<at::Tensor> v = {flat};
  auto work = impl_->backend_for(flat).allreduce(v);
  return [work, r = rank_, n = size_, t = timeout_s_] { wait_for(work, "gradient all-reduce", r, n, t); };
}

void Collectives::broadcast(std::vector<at::Tensor>& tensors, int root) {
  for (auto& [key, idx] : by_dtype(tensors)) {
    std::vector<at::Tensor> flat = {flatten(tensors, idx)};
    c10d::BroadcastOptions bo;
    bo.rootRank = root;
    wait_for(impl_->backend_for(flat[0]).broadcast(flat, bo), "broadcast", rank_, size_, timeout_s_);
    unflatten(flat[0], tensors, idx);
  }
}

void Collectives::barrier() { wait_for(impl_->pg->barrier(), "barrier", rank_, size_, timeout_s_); }

std::shared_ptr<Collectives> Collectives::subgroup(const std::vector<int>& ranks, const std::string& tag) {
  const auto me = std::find(ranks.begin(), ranks.end(), rank_);
  if (me == ranks.end())
    throw ValueError("rank " + std::to_string(rank_) + " is not in the group '" + tag + "' it was asked to join");
  std::shared_ptr<Collectives> c(new Collectives());
  c->impl_ = std::make_unique<Impl>();
  c->rank_ = static_cast<int>(me - ranks.begin());
  c->size_ = static_cast<int>(ranks.size());
  c->timeout_s_ = timeout_s_;
  c->impl_->store = c10::make_intrusive<c10d::PrefixStore>("kiln/group/" + tag, impl_->store);
  try {
    auto opts =
        c10d::ProcessGroupGloo::Options::create(std::chrono::milliseconds(static_cast<int64_t>(timeout_s_ * 1000)));
    opts->devices = impl_->pg->getOptions()->devices;
    opts->threads = 2;
    c->impl_->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(c->impl_->store, c->rank_, c->size_, opts);
    c->impl_->device = impl_->device;
    if (impl_->nccl)
      c->impl_->nccl = make_nccl_backend(c10::make_intrusive<c10d::PrefixStore>("kiln/nccl", c->impl_->store), c->rank_,
                                         c->size_, impl_->device.index(), timeout_s_);
  } catch (const std::exception& e) {
    throw Error("rank " + std::to_string(rank_) + ": cannot connect the group '" + tag + "' (" + cause_of(e) + ")");
  }
  return c;
}

std::vector<at::Tensor> Collectives::all_gather(const at::Tensor& t) {
  std::vector<at::Tensor> in = {t.contiguous()};
  std::vector<std::vector<at::Tensor>> out(1);
  for (int r = 0; r < size_; ++r) out[0].push_back(at::empty_like(in[0]));
  wait_for(impl_->backend_for(in[0]).allgather(out, in), "all-gather", rank_, size_, timeout_s_);
  return out[0];
}

// --- sharded optimizer state (ZeRO) -------------------------------------------------

std::function<void()> Collectives::reduce_sum_async(at::Tensor flat, int root) {
  if (root < 0 || root >= size_)
    throw ValueError("reduce: root must be a rank in [0, " + std::to_string(size_ - 1) +
                     "]. Received: root=" + std::to_string(root));
  const bool on_nccl = impl_->nccl && flat.is_cuda();
  if (flat.scalar_type() == at::kBFloat16 && !on_nccl) return all_reduce_sum_async(flat);
  if (impl_->shm && flat.scalar_type() == at::kFloat && flat.is_contiguous() && flat.device().is_cpu()) {
    auto done = impl_->shm->submit(flat, root);
    return [done] { done.get(); };
  }
  c10d::ReduceOptions ro;
  ro.rootRank = root;
  if (flat.is_cuda() && !on_nccl) {
    // Gloo reduces CPU tensors only: through a host copy.
    std::vector<at::Tensor> v = {flat.cpu()};
    auto work = impl_->pg->reduce(v, ro);
    return [work, v, flat, r = rank_, n = size_, t = timeout_s_, me = rank_, root]() mutable {
      wait_for(work, "gradient reduce", r, n, t);
      if (me == root) flat.copy_(v[0]);
    };
  }
  std::vector<at::Tensor> v = {flat};
  auto work = impl_->backend_for(flat).reduce(v, ro);
  return [work, r = rank_, n = size_, t = timeout_s_] { wait_for(work, "gradient reduce", r, n, t); };
}

}  // namespace kiln::distribute
