// Debian's c10d headers need USE_C10D_GLOO to declare ProcessGroupGloo. It
// is defined here, after the precompiled header, and only in this file
// (outside the unity batch), so every other file keeps the shared PCH.
#define USE_C10D_GLOO 1
#include "kiln/distribute/collectives.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <cstdlib>
#include <map>

#include "kiln/core/error.h"

namespace kiln::distribute {

struct Collectives::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
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

// Groups `tensors` by dtype into flat buffers (index lists per dtype).
std::map<at::ScalarType, std::vector<size_t>> by_dtype(const std::vector<at::Tensor>& tensors) {
  std::map<at::ScalarType, std::vector<size_t>> groups;
  for (size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].defined() && tensors[i].numel() > 0) groups[tensors[i].scalar_type()].push_back(i);
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
  return c;
}

Collectives::~Collectives() = default;

void Collectives::all_reduce_sum(std::vector<at::Tensor>& tensors) {
  for (auto& [dtype, idx] : by_dtype(tensors)) {
    std::vector<at::Tensor> flat = {flatten(tensors, idx)};
    wait_for(impl_->pg->allreduce(flat), "all-reduce", rank_, size_, timeout_s_);
    unflatten(flat[0], tensors, idx);
  }
}

std::function<void()> Collectives::all_reduce_sum_async(at::Tensor flat) {
  if (flat.scalar_type() == at::kBFloat16) {
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
  std::vector<at::Tensor> v = {flat};
  auto work = impl_->pg->allreduce(v);
  return [work, r = rank_, n = size_, t = timeout_s_] { wait_for(work, "gradient all-reduce", r, n, t); };
}

void Collectives::broadcast(std::vector<at::Tensor>& tensors, int root) {
  for (auto& [dtype, idx] : by_dtype(tensors)) {
    std::vector<at::Tensor> flat = {flatten(tensors, idx)};
    c10d::BroadcastOptions bo;
    bo.rootRank = root;
    wait_for(impl_->pg->broadcast(flat, bo), "broadcast", rank_, size_, timeout_s_);
    unflatten(flat[0], tensors, idx);
  }
}

void Collectives::barrier() { wait_for(impl_->pg->barrier(), "barrier", rank_, size_, timeout_s_); }

}  // namespace kiln::distribute
