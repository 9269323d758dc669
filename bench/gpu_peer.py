"""PyTorch eager's side of bench/gpu_bench.sh: the workloads of
bench/train_gpu_bench.cc (all but `pipeline`, which is kiln against itself),
written as a PyTorch user would (nn.Sequential / nn.Module, torch.optim.Adam
with Keras's epsilon, autocast for mixed_bfloat16, channels_last for the
convnet, nn.MultiheadAttention with need_weights=False so that it runs
scaled_dot_product_attention), data resident on the device, on the same
LibTorch. Takes the same flags and prints lines with the same keys
("torch <workload> ...: <value> <unit>"); every time is the median of the
epochs after a warm-up epoch.

float8: if torch has `torch._scaled_mm` and the device is CUDA with compute
capability >= 8.9, 4 x Float8Linear (inputs and weights in e4m3fn, output
gradients in e5m2, per-tensor scales from the current amax: dynamic scaling,
as torchao's default) against the same model under bf16 autocast; otherwise
it prints a "torch float8 skipped: <why>" line."""
import argparse
import statistics
import time

import torch
from torch import nn

E4M3_MAX = 448.0
E5M2_MAX = 57344.0


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def epoch_seconds(model, x, y, batch, device, loss_fn, bf16=False, epochs=4):
    # Keras's Adam defaults (epsilon 1e-7); PyTorch's own Adam otherwise.
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7)
    model.train()
    n = x.shape[0]
    times = []
    for _ in range(epochs):
        sync(device)
        t0 = time.perf_counter()
        perm = torch.randperm(n, device=device)
        for i in range(0, n, batch):
            idx = perm[i:i + batch]
            xb, yb = x[idx], y[idx]
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def mlp(widths, n_in, classes, linear=nn.Linear):
    layers, prev = [], n_in
    for w in widths:
        layers += [linear(prev, w), nn.ReLU()]
        prev = w
    layers.append(linear(prev, classes))
    return nn.Sequential(*layers)


def run_dense(a, device):
    for policy in a.policies.split(","):
        for b in (int(s) for s in a.sizes.split(",")):
            x = torch.randn(b * a.steps, 1024, device=device)
            y = torch.randint(1024, (b * a.steps,), device=device)
            torch.manual_seed(1)
            model = mlp([1024, 1024, 1024], 1024, 1024).to(device)
            s = epoch_seconds(model, x, y, b, device, nn.CrossEntropyLoss(), policy == "mixed_bfloat16")
            print(f"torch dense4x1024 {policy} batch {b}: {1e3 * s / a.steps:.3f} ms/step", flush=True)


def run_mlp(a, device):
    x = torch.rand(a.mlp_rows, 784, device=device)
    y = torch.randint(10, (a.mlp_rows,), device=device)
    torch.manual_seed(1)
    s = epoch_seconds(mlp([256, 256], 784, 10).to(device), x, y, 128, device, nn.CrossEntropyLoss())
    print(f"torch mlp784 float32 batch 128: {s:.3f} s/epoch", flush=True)


def run_conv(a, device):
    # Keras's simple MNIST convnet; the softmax is inside CrossEntropyLoss, as
    # a PyTorch user writes it.
    torch.manual_seed(1)
    model = nn.Sequential(
        nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Dropout(0.5), nn.Linear(64 * 5 * 5, 10),
    ).to(device).to(memory_format=torch.channels_last)
    x = torch.rand(a.conv_rows, 1, 28, 28, device=device).contiguous(memory_format=torch.channels_last)
    y = torch.randint(10, (a.conv_rows,), device=device)
    s = epoch_seconds(model, x, y, 128, device, nn.CrossEntropyLoss())
    print(f"torch convnet float32 batch 128: {s:.3f} s/epoch", flush=True)


def bf16_matmul_flops(device, n):
    """FLOP/s of an n^3 bf16 matmul (best of 5), the MFU line's peak."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    iters = 10 if device.type == "cuda" else 1
    per = []
    for _ in range(5):
        sync(device)
        t0 = time.perf_counter()
        for _ in range(iters):
            a @ b
        sync(device)
        per.append((time.perf_counter() - t0) / iters)
    return 2.0 * n ** 3 / min(per)


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.att = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln1 = nn.LayerNorm(d, eps=1e-3)  # Keras's epsilon
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.ReLU(), nn.Linear(4 * d, d))
        self.ln2 = nn.LayerNorm(d, eps=1e-3)

    def forward(self, x):
        a, _ = self.att(x, x, x, need_weights=False)
        h = self.ln1(x + a)
        return self.ln2(h + self.ff(h))


def run_transformer(a, device):
    peak = bf16_matmul_flops(device, a.peak_n)
    print(f"torch bf16 matmul {a.peak_n}: {peak / 1e12:.2f} TFLOP/s", flush=True)
    b, s, d = a.tf_batch, a.tf_seq, a.tf_d_model
    torch.manual_seed(1)
    model = Block(d, a.tf_heads).to(device)
    x = torch.randn(b * a.tf_steps, s, d, device=device)
    y = torch.randn(b * a.tf_steps, s, d, device=device)
    step = epoch_seconds(model, x, y, b, device, nn.MSELoss(), bf16=True) / a.tf_steps
    # train_gpu_bench.cc's transformer_step_flops: 3 x (24 B S d^2 + 4 B S^2 d).
    flops = 3.0 * (24.0 * b * s * d * d + 4.0 * b * s * s * d)
    print(f"torch transformer bf16 batch {b}: {1e3 * step:.3f} ms/step", flush=True)
    print(f"torch transformer bf16 MFU: {100.0 * flops / step / peak:.1f} %", flush=True)


def to_float8(t, dtype, fmax):
    """t in `dtype` with a per-tensor scale from its current amax, and the
    scale that multiplies it back (what _scaled_mm takes)."""
    amax = t.detach().abs().max().float().clamp(min=1e-12)
    scale = fmax / amax
    return (t.float() * scale).clamp(-fmax, fmax).to(dtype), scale.reciprocal()


class Float8MatMul(torch.autograd.Function):
    """y = x @ w.T in float8 on _scaled_mm, bf16 out; the backward products
    take the output gradient in e5m2. _scaled_mm wants its first operand
    row-major and its second column-major."""

    @staticmethod
    def forward(ctx, x, w):
        xq, xs = to_float8(x, torch.float8_e4m3fn, E4M3_MAX)
        wq, ws = to_float8(w, torch.float8_e4m3fn, E4M3_MAX)
        ctx.save_for_backward(xq, xs, wq, ws)
        return torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16)

    @staticmethod
    def backward(ctx, g):
        xq, xs, wq, ws = ctx.saved_tensors
        gq, gs = to_float8(g, torch.float8_e5m2, E5M2_MAX)
        dx = torch._scaled_mm(gq, wq.t().contiguous().t(), scale_a=gs, scale_b=ws, out_dtype=torch.bfloat16)
        dw = torch._scaled_mm(gq.t().contiguous(), xq.t().contiguous().t(), scale_a=gs, scale_b=xs,
                              out_dtype=torch.float32)
        return dx, dw


class Float8Linear(nn.Linear):
    def forward(self, x):
        lead = x.shape[:-1]
        y = Float8MatMul.apply(x.reshape(-1, x.shape[-1]), self.weight)
        return y.reshape(*lead, -1) + self.bias.to(y.dtype)


def float8_unavailable(device):
    if not hasattr(torch, "_scaled_mm"):
        return f"torch {torch.__version__} has no torch._scaled_mm"
    if device.type != "cuda":
        return f"device {device} is not CUDA"
    cap = torch.cuda.get_device_capability(device)
    if cap < (8, 9):
        return f"compute capability {cap[0]}.{cap[1]} < 8.9"
    return None


def run_float8(a, device):
    w, b, steps = a.f8_width, a.f8_batch, a.f8_steps
    x = torch.randn(b * steps, w, device=device)
    y = torch.randint(w, (b * steps,), device=device)
    key = f"dense4x{w}"
    why = float8_unavailable(device)
    f8 = None
    if why is None:
        torch.manual_seed(1)
        model = mlp([w] * 3, w, w, linear=Float8Linear).to(device)
        try:
            f8 = epoch_seconds(model, x, y, b, device, nn.CrossEntropyLoss(), bf16=True)
            print(f"torch {key} float8 batch {b}: {1e3 * f8 / steps:.3f} ms/step", flush=True)
        except RuntimeError as e:
            why = f"_scaled_mm failed: {str(e).splitlines()[0]}"
        del model
    if why is not None:
        print(f"torch float8 skipped: {why}", flush=True)
    torch.manual_seed(1)
    model = mlp([w] * 3, w, w).to(device)
    bf16 = epoch_seconds(model, x, y, b, device, nn.CrossEntropyLoss(), bf16=True)
    print(f"torch {key} bf16 batch {b}: {1e3 * bf16 / steps:.3f} ms/step", flush=True)
    if f8 is not None:
        print(f"torch {key} float8 speedup over bf16: {bf16 / f8:.2f} x", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--workloads", default="dense,mlp,conv,transformer,float8,pipeline")
    p.add_argument("--sizes", default="256,1024,8192")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--policies", default="float32,mixed_bfloat16")
    p.add_argument("--mlp_rows", type=int, default=60000)
    p.add_argument("--conv_rows", type=int, default=60000)
    p.add_argument("--tf_batch", type=int, default=32)
    p.add_argument("--tf_seq", type=int, default=512)
    p.add_argument("--tf_d_model", type=int, default=1024)
    p.add_argument("--tf_heads", type=int, default=16)
    p.add_argument("--tf_steps", type=int, default=10)
    p.add_argument("--peak_n", type=int, default=8192)
    p.add_argument("--f8_width", type=int, default=8192)
    p.add_argument("--f8_batch", type=int, default=8192)
    p.add_argument("--f8_steps", type=int, default=10)
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
    runs = {"dense": run_dense, "mlp": run_mlp, "conv": run_conv, "transformer": run_transformer,
            "float8": run_float8, "pipeline": None}
    workloads = a.workloads.split(",")
    for w in workloads:
        if w not in runs:
            p.error(f"unknown workload '{w}' in --workloads")
    for w in workloads:
        if runs[w] is not None:
            runs[w](a, device)


if __name__ == "__main__":
    main()
