#!/usr/bin/env python3
"""PyTorch's numbers for bench/precision_bench.sh, measured in the same run:
the 4 x Dense(1024) MLP (784 -> 1024 x4 -> 10, relu) as torch.nn.Linear
layers, with kiln's shapes and batch sizes.

  training step, batch 256, Adam: float32 and torch.autocast(bfloat16)
  inference at batch 1, 32, 256: float32, bfloat16 weights, and
  torch.ao.quantization.quantize_dynamic (qint8 Linear; the engine is the
  first this PyTorch has of onednn, x86, fbgemm, qnnpack; and, as
  quantize_dynamic_int8_x86, the x86 engine (fbgemm's kernels) too)

Prints one JSON object. Run with .venv's python (the torch kiln builds against):
  .venv/bin/python bench/precision_peer.py --threads 2 --steps 20
"""
import argparse
import json
import time

import torch


def mlp():
    torch.manual_seed(1)
    layers = []
    width = 784
    for _ in range(4):
        layers += [torch.nn.Linear(width, 1024), torch.nn.ReLU()]
        width = 1024
    layers += [torch.nn.Linear(1024, 10)]
    return torch.nn.Sequential(*layers)


def best_ms(fn, steps, reps=1):
    """The fastest repetition (ms), as kiln's precision_bench reports: other
    processes on a shared machine only ever add time."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        times.append((time.perf_counter() - t0) / reps)
    return min(times) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    out = {"torch": torch.__version__, "threads": torch.get_num_threads()}

    x = torch.rand(256, 784)
    y = torch.randint(0, 10, (256,))
    loss_fn = torch.nn.CrossEntropyLoss()
    train = {}
    for name, autocast in (("float32", False), ("autocast_bfloat16", True)):
        m = mlp()
        opt = torch.optim.Adam(m.parameters(), lr=1e-3)

        def step():
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = loss_fn(m(x), y)
            loss.backward()
            opt.step()

        train[name] = best_ms(step, a.steps)
    out["train_step_ms"] = train

    engines = torch.backends.quantized.supported_engines
    engine = next((e for e in ("onednn", "x86", "fbgemm", "qnnpack") if e in engines), None)
    out["quantized_engine"] = engine
    models = {"float32": mlp().eval(), "bfloat16": mlp().eval().bfloat16()}
    # The engine is read when a quantized module runs, so each model runs
    # under the engine it was quantized for.
    model_engine = {}
    for key, eng in (("quantize_dynamic_int8", engine), ("quantize_dynamic_int8_x86", "x86")):
        if eng in engines and eng not in model_engine.values():
            torch.backends.quantized.engine = eng
            models[key] = torch.ao.quantization.quantize_dynamic(mlp().eval(), {torch.nn.Linear}, dtype=torch.qint8)
            model_engine[key] = eng
    infer = {}
    with torch.no_grad():
        for name, m in models.items():
            if name in model_engine:
                torch.backends.quantized.engine = model_engine[name]
            infer[name] = {}
            for batch in (1, 32, 256):
                xb = torch.rand(batch, 784)
                if name == "bfloat16":
                    xb = xb.bfloat16()
                reps = 20 if batch == 1 else 5 if batch == 32 else 1
                infer[name][str(batch)] = best_ms(lambda: m(xb), a.steps, reps)
    out["infer_ms"] = infer
    print(json.dumps(out))


if __name__ == "__main__":
    main()
