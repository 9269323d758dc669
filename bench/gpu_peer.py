"""PyTorch eager's side of bench/gpu_bench.sh: the workloads of
bench/train_gpu_bench.cc, written as a PyTorch user would (nn.Sequential,
torch.optim.Adam with its defaults, autocast for mixed_bfloat16), data
resident on the device, on the same LibTorch. Prints lines in the same
format ("torch <workload> <policy> batch <B>: <ms> ms/step")."""
import argparse
import statistics
import time

import torch
from torch import nn


def epoch_seconds(widths, n_in, classes, x, y, batch, policy, device):
    torch.manual_seed(1)
    layers, prev = [], n_in
    for w in widths:
        layers += [nn.Linear(prev, w), nn.ReLU()]
        prev = w
    layers.append(nn.Linear(prev, classes))
    model = nn.Sequential(*layers).to(device)
    # Keras's Adam defaults (epsilon 1e-7); PyTorch's own Adam otherwise.
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7)
    loss_fn = nn.CrossEntropyLoss()
    n = x.shape[0]
    times = []
    for _ in range(4):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        perm = torch.randperm(n, device=device)
        for i in range(0, n, batch):
            idx = perm[i:i + batch]
            xb, yb = x[idx], y[idx]
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=policy == "mixed_bfloat16"):
                loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--sizes", default="256,1024,8192")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--policies", default="float32,mixed_bfloat16")
    p.add_argument("--mlp_rows", type=int, default=60000)
    p.add_argument("--threads", type=int, default=0)
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    # TensorFlow's and kiln's default: TF32 for float32 products on GPUs.
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    print(f"device {device}; torch {torch.__version__}; threads {torch.get_num_threads()}", flush=True)
    torch.manual_seed(0)
    for policy in a.policies.split(","):
        for b in (int(s) for s in a.sizes.split(",")):
            x = torch.randn(b * a.steps, 1024, device=device)
            y = torch.randint(1024, (b * a.steps,), device=device)
            s = epoch_seconds([1024, 1024, 1024], 1024, 1024, x, y, b, policy, device)
            print(f"torch dense4x1024 {policy} batch {b}: {1e3 * s / a.steps:.3f} ms/step", flush=True)
    x = torch.rand(a.mlp_rows, 784, device=device)
    y = torch.randint(10, (a.mlp_rows,), device=device)
    s = epoch_seconds([256, 256], 784, 10, x, y, 128, "float32", device)
    print(f"torch mlp784 float32 batch 128: {s:.3f} s/epoch", flush=True)


if __name__ == "__main__":
    main()
