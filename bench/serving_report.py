"""Prints the results table of bench/serving_bench.sh and its ratios against
issue #4's goals, then the front ends against the machine's HTTP ceiling
(nginx `return 200`) and issue 15 §4's goals. Input: results.txt (lines
"MODEL RUN {json}"; MODEL "nginx" for the ceiling) and the log directory
(answers of kiln and the peer, batch-size metrics).

    /usr/bin/python3 bench/serving_report.py RESULTS.txt LOGDIR [--machine TEXT] [--cpu TEXT]
"""

import argparse
import json
import os
import re

p = argparse.ArgumentParser()
p.add_argument("results")
p.add_argument("logs")
p.add_argument("--machine", default="")
p.add_argument("--cpu", default="", help="CPU model and instruction sets")
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
    ("grpc_h2load_plain", "kiln gRPC, no batching (h2load)"),
    ("grpc_h2load_batched", "kiln gRPC, batching (h2load)"),
    ("ceil_health", "kiln GET /v2/health/live (wrk -t2 -c32)"),
    ("ceil_rest_batched", "kiln REST, batching (wrk -t2 -c32)"),
    ("flask", "Flask + PyTorch, gunicorn 2 workers (wrk)"),
    ("rest_gen_peak", "kiln REST, batching, closed loop with the fixed-rate generator (serving_bench load)"),
    ("rest_half", "kiln REST, batching, fixed rate = half the generator's peak"),
    ("grpc_half", "kiln gRPC, batching, fixed rate = half peak"),
    ("plain_rest_gen_peak", "kiln REST, no batching, closed loop with the fixed-rate generator"),
    ("plain_rest_half", "kiln REST, no batching, fixed rate = half the generator's peak"),
    ("plain_grpc_half", "kiln gRPC, no batching, fixed rate = half peak"),
]

print()
if a.cpu:
    print(f"cpu: {a.cpu}")
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
        threads = m["clients"].get("rest_api_num_threads")
        threads = "" if threads is None else f"; --rest_api_num_threads {threads or 'not passed (server default)'}"
        print(f"  {model}: closed-loop clients (wrk connections, gRPC clients) = {m['clients']['connections']}{threads}")
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

# ---- issue 15 §4: the front ends against the HTTP ceiling -------------------------

ng = [R.get("nginx", {}).get(k) for k in ("start", "end")]
ng_qps = [r["qps"] for r in ng if r]
ceiling = sum(ng_qps) / len(ng_qps) if ng_qps else None
m = R.get("mnist", {})


def ratio(q):
    return f"{q / ceiling:.3f}" if ceiling and q is not None else "-"


def p99_p50(r):
    return r["p99_ms"] / r["p50_ms"] if r and r.get("p50_ms") else None


CEILING_ROWS = [
    (R.get("nginx", {}).get("start"), "nginx return 200, 2 workers (wrk -t2 -c32), at the start"),
    (R.get("nginx", {}).get("end"), "nginx return 200, 2 workers (wrk -t2 -c32), at the end"),
    (m.get("ceil_health"), "kiln GET /v2/health/live, empty (wrk -t2 -c32)"),
    (m.get("ceil_rest_batched"), "kiln REST predict, 1 row, batching (wrk -t2 -c32)"),
    (m.get("grpc_h2load_batched"), "kiln gRPC Predict, 1 row, batching (h2load -t2 -c32 -m1)"),
    (m.get("grpc_batched"), "kiln gRPC Predict, 1 row, batching (serving_bench: 32 sync clients)"),
    (m.get("plain_rest_half"), "kiln REST predict, no batching, fixed rate = half the generator's peak"),
    (m.get("plain_grpc_half"), "kiln gRPC Predict, no batching, fixed rate = half peak"),
]
if ceiling:
    print()
    print("front ends against the HTTP ceiling (issue 15 §4), mnist, one `kiln serve` per mode:")
    print(f"nginx ceiling = mean of start and end = {ceiling:,.0f} requests/s"
          + (f" (start {ng_qps[0]:,.0f}, end {ng_qps[-1]:,.0f})" if len(ng_qps) == 2 else " (only one nginx run)"))
    print()
    print("| run | QPS | p50 ms | p99 ms | p99/p50 | failed | x nginx |")
    print("|---|---|---|---|---|---|---|")
    for r, label in CEILING_ROWS:
        if r is None:
            continue
        extra = f" ({r['rate']:.0f}/s)" if r.get("rate") else ""
        print(f"| {label}{extra} | {fmt(r['qps'])} | {fmt(r['p50_ms'], 2)} | {fmt(r['p99_ms'], 2)} "
              f"| {fmt(p99_p50(r), 2)} | {r['failed']} | {ratio(r['qps'])} |")
    # The fixed-rate generator counts latency from each request's due time,
    # so its own lateness (woken late on the shared cores) is in p99 too.
    for r, label in CEILING_ROWS:
        if r is not None and "late_p99_ms" in r:
            print(f"  {label}: the generator itself sent late by p50 {r['late_p50_ms']:.3f} / "
                  f"p99 {r['late_p99_ms']:.3f} ms (counted in the latency)")

    print()
    print("gRPC load generators on the same server, back to back (closed loop, same number of clients):")
    print("| model | batching | serving_bench (sync C++ clients) QPS | h2load QPS | h2load / serving_bench "
          "| p50 ms serving_bench / h2load | generator CPU us per request serving_bench / h2load |")
    print("|---|---|---|---|---|---|---|")
    for model in ("mnist", "large"):
        for mode in ("plain", "batched"):
            sb, h2 = R.get(model, {}).get(f"grpc_{mode}"), R.get(model, {}).get(f"grpc_h2load_{mode}")
            if sb and h2 and sb["qps"] > 0:
                print(f"| {model} | {'yes' if mode == 'batched' else 'no'} | {fmt(sb['qps'])} | {fmt(h2['qps'])} "
                      f"| {h2['qps'] / sb['qps']:.2f}x | {fmt(sb['p50_ms'], 2)} / {fmt(h2['p50_ms'], 2)} "
                      f"| {fmt(sb.get('generator_cpu_us_per_request'))} / "
                      f"{fmt(h2.get('generator_cpu_us_per_request'))} |")

    print()
    print("| goal (issue 15 §4) | measured | |")
    print("|---|---|---|")

    def goal(text, value, ok):
        print(f"| {text} | {value} | {'met' if ok else 'missed'} |")

    h, rb, gb = m.get("ceil_health"), m.get("ceil_rest_batched"), m.get("grpc_h2load_batched")
    if h:
        goal("kiln empty GET /v2/health/live >= 0.8x nginx", f"{h['qps'] / ceiling:.3f}x", h["qps"] >= 0.8 * ceiling)
    if rb:
        goal("kiln REST predict, 1 row, batching >= 0.3x nginx", f"{rb['qps'] / ceiling:.3f}x",
             rb["qps"] >= 0.3 * ceiling)
    if gb and rb:
        goal("kiln gRPC Predict (h2load) >= REST predict (wrk), 1 row, batching",
             f"{gb['qps']:,.0f} vs {rb['qps']:,.0f} = {gb['qps'] / rb['qps']:.2f}x"
             + (f" ({gb['failed']} gRPC failed)" if gb["failed"] else ""),
             gb["qps"] >= rb["qps"] and gb["failed"] == 0)
    for key, name in (("plain_rest_half", "REST"), ("plain_grpc_half", "gRPC")):
        r = m.get(key)
        q = p99_p50(r)
        if q is not None:
            goal(f"no batching, {name}: p99/p50 <= 5 at half the peak", f"{q:.2f} at {r['rate']:.0f}/s",
                 q <= 5 and r["failed"] == 0)
