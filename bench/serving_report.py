"""Prints the results table of bench/serving_bench.sh and its ratios against
issue #4's goals. Input: results.txt (lines "MODEL RUN {json}") and the
log directory (answers of kiln and the peer, batch-size metrics).

    /usr/bin/python3 bench/serving_report.py RESULTS.txt LOGDIR [--machine TEXT]
"""

import argparse
import json
import os
import re

p = argparse.ArgumentParser()
p.add_argument("results")
p.add_argument("logs")
p.add_argument("--machine", default="")
a = p.parse_args()

R = {}
for line in open(a.results):
    parts = line.strip().split(" ", 2)
    if len(parts) < 3 or not parts[2].startswith("{"):
        print(f"(no result for {' '.join(parts[:2])})")
        continue
    R.setdefault(parts[0], {})[parts[1]] = json.loads(parts[2])


def mean_batch(model, mode):
    path = os.path.join(a.logs, f"{model}-{mode}.batch")
    if not os.path.exists(path):
        return None
    vals = {}
    for line in open(path):
        m = re.match(r"kiln_batch_size_(sum|count)\{[^}]*\} (\S+)", line)
        if m:
            vals[m.group(1)] = float(m.group(2))
    return vals["sum"] / vals["count"] if vals.get("count") else None


def max_diff(model):
    try:
        k = json.load(open(os.path.join(a.logs, f"{model}-kiln-batched.answer")))["predictions"][0]
        f = json.load(open(os.path.join(a.logs, f"{model}-flask.answer")))["predictions"][0]
    except (OSError, ValueError, KeyError, IndexError):
        return None
    return max(abs(x - y) for x, y in zip(k, f)) if len(k) == len(f) else float("inf")


def fmt(v, d=1):
    return "-" if v is None else f"{v:,.{d}f}"


LABELS = [
    ("bound_b1", "in-process predict, batch 1 (rows/s)"),
    ("bound_b32", "in-process predict, batch 32 (rows/s): the bound"),
    ("bound_b32_after", "the bound again, after the server runs"),
    ("rest_plain", "kiln REST, no batching (wrk)"),
    ("grpc_plain", "kiln gRPC, no batching"),
    ("rest_batched", "kiln REST, batching (wrk)"),
    ("rest_batched_rows32", "kiln REST, batching, 32 rows per request (wrk; QPS in rows/s)"),
    ("rest_ceiling", "HTTP ceiling: GET /v2/health/live, no body, no model (wrk)"),
    ("grpc_batched", "kiln gRPC, batching"),
    ("flask", "Flask + PyTorch, gunicorn 2 workers (wrk)"),
    ("rest_gen_peak", "kiln REST, batching, closed loop with the fixed-rate generator (serving_bench load)"),
    ("rest_half", "kiln REST, batching, fixed rate = half the generator's peak"),
    ("grpc_half", "kiln gRPC, batching, fixed rate = half peak"),
]

print()
if a.machine:
    print(f"machine: {a.machine}")
print("| model | run | QPS | p50 ms | p99 ms | p99/p50 | failed |")
print("|---|---|---|---|---|---|---|")
for model in ("mnist", "large"):
    for key, label in LABELS:
        r = R.get(model, {}).get(key)
        if r is None:
            continue
        if key.startswith("bound"):
            print(f"| {model} | {label} | {fmt(r['rows_per_s'])} | {fmt(r['batch_p50_ms'], 3)} (per batch) | - | - | - |")
            continue
        if key == "rest_batched_rows32":
            r = dict(r, qps=r["qps"] * 32)
        ratio = r["p99_ms"] / r["p50_ms"] if r.get("p50_ms") else None
        extra = f" (rate {r['rate']:.0f}/s)" if r.get("rate") else ""
        print(f"| {model} | {label}{extra} | {fmt(r['qps'])} | {fmt(r['p50_ms'], 2)} | {fmt(r['p99_ms'], 2)} "
              f"| {fmt(ratio, 2)} | {r['failed']} |")

print()
print("goals (issue #4):")
for model in ("mnist", "large"):
    m = R.get(model, {})
    if m.get("clients"):
        print(f"  {model}: closed-loop clients (wrk connections, gRPC clients) = {m['clients']['connections']}")
    rb, b32, fl = m.get("rest_batched"), m.get("bound_b32"), m.get("flask")
    if b32 and m.get("bound_b32_after"):
        after = m["bound_b32_after"]["rows_per_s"]
        print(f"  {model}: bound measured before / after the server runs: {b32['rows_per_s']:,.0f} / {after:,.0f} rows/s")
        b32 = dict(b32, rows_per_s=(b32["rows_per_s"] + after) / 2)
    if rb and b32:
        ok = rb["qps"] >= 0.7 * b32["rows_per_s"]
        print(f"  {model}: REST batching / in-process bound = {rb['qps'] / b32['rows_per_s']:.3f} (goal >= 0.70) "
              f"{'MET' if ok else 'MISSED'}")
    r32 = m.get("rest_batched_rows32")
    if r32 and b32:
        print(f"  {model}: REST batching with 32-row requests / bound = {r32['qps'] * 32 / b32['rows_per_s']:.3f} (rows/s)")
    ce = m.get("rest_ceiling")
    if ce and b32:
        print(f"  {model}: HTTP ceiling (empty GET, same wrk and cores) = {ce['qps']:,.0f}/s = "
              f"{ce['qps'] / b32['rows_per_s']:.3f} of the bound; one-row requests cannot pass it")
    if rb and fl and fl["qps"] > 0:
        ok = rb["qps"] >= 10 * fl["qps"]
        print(f"  {model}: REST batching / Flask = {rb['qps'] / fl['qps']:.2f}x (goal >= 10x) {'MET' if ok else 'MISSED'}")
    for key in ("rest_half", "grpc_half"):
        r = m.get(key)
        if r and r["p50_ms"] > 0:
            q = r["p99_ms"] / r["p50_ms"]
            print(f"  {model}: {key}: p99/p50 = {q:.2f} at {r['rate']:.0f}/s (goal <= 3) {'MET' if q <= 3 else 'MISSED'}")
    for mode in ("plain", "batched"):
        mb = mean_batch(model, mode)
        if mb is not None:
            print(f"  {model}: mean executed batch size ({mode}) = {mb:.1f}")
    d = max_diff(model)
    if d is not None:
        print(f"  {model}: max |kiln - Flask| on the same request = {d:.2e} (same weights, same network)")

s = R.get("mnist", {}).get("swaps")
if s:
    ok = s["failed"] == 0 and s["swaps"] == 50 and "error" not in s
    print(f"  version swaps: {s['swaps']} swaps, {s['ok']} requests OK, {s['failed']} failed {s.get('failures', {})}; "
          f"swap (copy in -> AVAILABLE) p50 {s['swap_p50_ms']:.0f} ms, max {s['swap_max_ms']:.0f} ms "
          f"(goal: 0 failed across 50) {'MET' if ok else 'MISSED'}" + (f"; error: {s['error']}" if "error" in s else ""))
i = R.get("mnist", {}).get("isolation")
if i:
    q, b = i["quiet"], i["reloading"]
    print(f"  reload isolation: mnist at {i['rate']:.0f}/s alone p50 {q['p50_ms']:.2f} / p99 {q['p99_ms']:.2f} ms; "
          f"while 'large' reloaded {i['reloads']} times (p50 {i['reload_p50_ms']:.0f} ms each) "
          f"p50 {b['p50_ms']:.2f} / p99 {b['p99_ms']:.2f} ms; failed {q['failed'] + b['failed']}"
          + (f"; error: {i['error']}" if "error" in i else ""))
