"""PyTorch DDP peer of bench/data_parallel_bench.cc: the same MLP (input
1024, 4 x Linear(1024)+ReLU, Linear(10)), SGD, global batch 1024 split over
the ranks, torch.distributed with gloo. Started by the same launcher (kiln
launch sets RANK/WORLD_SIZE/MASTER_* and OMP_NUM_THREADS like torchrun):

  kiln launch --nproc_per_node 2 --threads_per_rank 1 -- \
      .venv/bin/python bench/ddp_peer.py [--steps 20] [--batch 1024] [--width 1024]

Prints (rank 0): ddp ranks=2 threads=1 ms_per_step=...
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--width", type=int, default=1024)
    a = p.parse_args()
    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    torch.set_num_threads(threads)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo")
    torch.manual_seed(1)
    layers = []
    for _ in range(4):
        layers += [nn.Linear(a.width, a.width), nn.ReLU()]
    layers.append(nn.Linear(a.width, 10))
    model = nn.Sequential(*layers)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    local = a.batch // world
    x = torch.randn(a.steps, local, a.width)
    y = torch.randint(0, 10, (a.steps, local))
    times = []
    for s in range(a.steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(model(x[s]), y[s])
        loss.backward()
        opt.step()
        loss.item()
        if s >= 2:
            times.append(time.perf_counter() - t0)
    if rank == 0:
        ms = 1e3 * sum(times) / len(times)
        print("ddp ranks=%d threads=%d ms_per_step=%.2f samples_per_s=%.0f" % (world, threads, ms, a.batch * 1e3 / ms),
              flush=True)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
