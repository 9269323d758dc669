#!/usr/bin/env python3
"""PyTorch peer for bench/mlp_fit_bench: the same 784-256-256-10 MLP, data,
batch size, optimizer (Adam, lr 1e-3, Keras's epsilon 1e-7) and epochs as
kiln's fit(), written as the usual PyTorch training loop.

Run with .venv's interpreter (the torch kiln builds against): .venv/bin/python bench/pytorch_mlp.py
Prints one JSON line: {"peer": "pytorch", "epoch_s": [...], "test_accuracy": ...}.
"""
import argparse
import gzip
import json
import os
import time

import numpy as np
import torch


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch_size", type=int, default=128)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    d = os.environ.get("KILN_FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")
    x_train = torch.from_numpy(read_idx(f"{d}/train-images-idx3-ubyte.gz").reshape(-1, 784).astype(np.float32) / 255.0)
    y_train = torch.from_numpy(read_idx(f"{d}/train-labels-idx1-ubyte.gz").astype(np.int64))
    x_test = torch.from_numpy(read_idx(f"{d}/t10k-images-idx3-ubyte.gz").reshape(-1, 784).astype(np.float32) / 255.0)
    y_test = torch.from_numpy(read_idx(f"{d}/t10k-labels-idx1-ubyte.gz").astype(np.int64))

    model = torch.nn.Sequential(
        torch.nn.Linear(784, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7)
    loss_fn = torch.nn.CrossEntropyLoss()
    n = x_train.shape[0]
    epoch_s = []
    for _ in range(args.epochs):
        t0 = time.perf_counter()
        perm = torch.randperm(n)
        model.train()
        for i in range(0, n, args.batch_size):
            idx = perm[i:i + args.batch_size]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x_train[idx]), y_train[idx])
            loss.backward()
            opt.step()
        epoch_s.append(time.perf_counter() - t0)
    model.eval()
    with torch.no_grad():
        acc = (model(x_test).argmax(1) == y_test).float().mean().item()
    print(json.dumps({"peer": "pytorch", "threads": torch.get_num_threads(),
                      "epoch_s": epoch_s, "test_accuracy": acc}))


if __name__ == "__main__":
    main()
