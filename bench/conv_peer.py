#!/usr/bin/env python3
"""PyTorch peer for bench/conv_bench: the same conv net with BatchNorm as
kiln's, written as the usual PyTorch training loop in channels_last memory
format (PyTorch's fast CPU and cuDNN layout for convolutions):

  Conv2d(1, 32, 3, padding=1) - BatchNorm2d - ReLU - MaxPool2d(2)
  Conv2d(32, 64, 3, padding=1) - BatchNorm2d - ReLU - MaxPool2d(2)
  flatten (in NHWC order, as Keras's Flatten: a view of channels_last) - Linear(3136, 10)

Keras's settings where they differ from PyTorch's defaults: BatchNorm eps 1e-3,
momentum 0.01 (Keras's 0.99), Adam eps 1e-7. Random 28x28x1 data, batch 128,
float32; one fixed batch, as kiln's side.

Run with .venv's interpreter (the torch kiln builds against):
  .venv/bin/python bench/conv_peer.py --threads 2 --steps 30
Prints one JSON line: {"peer": "pytorch", "step_ms": [...], ...}.
"""
import argparse
import json
import os
import time

import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        layers = []
        cin = 1
        for filters in (32, 64):
            layers += [
                torch.nn.Conv2d(cin, filters, 3, padding=1),
                torch.nn.BatchNorm2d(filters, eps=1e-3, momentum=0.01),
                torch.nn.ReLU(),
                torch.nn.MaxPool2d(2),
            ]
            cin = filters
        self.features = torch.nn.Sequential(*layers)
        self.head = torch.nn.Linear(7 * 7 * 64, 10)

    def forward(self, x):
        h = self.features(x)
        return self.head(h.permute(0, 2, 3, 1).flatten(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch_size", type=int, default=128)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    model = Net().to(memory_format=torch.channels_last)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.rand(args.batch_size, 1, 28, 28).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (args.batch_size,))

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    model.train()
    for _ in range(args.warmup):
        step()
    step_ms = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        step_ms.append((time.perf_counter() - t0) * 1e3)
    print(json.dumps({"peer": "pytorch", "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "step_ms": step_ms}))


if __name__ == "__main__":
    main()
