"""gRPC Predict load from h2load for bench/serving_bench.sh: raw HTTP/2 POSTs
of one framed PredictRequest (serving_bench make_grpc_body), closed loop,
`clients` connections with one stream each. Prints one JSON line like
serving_bench load: qps, p50/p90/p99/max ms, ok, failed.

h2load counts HTTP statuses only, and a gRPC error arrives as HTTP 200 with
a grpc-status trailer. So the server's own counter decides what succeeded:
kiln_requests_total{protocol="grpc",api="predict",model=M} from /metrics,
read before and after the measured run, split into code="OK" and the rest.

    /usr/bin/python3 bench/serving_h2load.py --grpc HOST:PORT --rest HOST:PORT --model M --body FILE
        [--clients 32] [--threads 2] [--seconds 8] [--warmup 1] [--log FILE]
"""

import argparse
import json
import re
import resource
import subprocess
import sys
import tempfile
import urllib.request

p = argparse.ArgumentParser()
p.add_argument("--grpc", required=True, help="HOST:PORT of the gRPC server")
p.add_argument("--rest", required=True, help="HOST:PORT of the REST server (for /metrics)")
p.add_argument("--model", required=True)
p.add_argument("--body", required=True, help="the framed PredictRequest")
p.add_argument("--clients", type=int, default=32)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--seconds", type=float, default=8)
p.add_argument("--warmup", type=float, default=1)
p.add_argument("--log", default="", help="keep h2load's per-request log here")
a = p.parse_args()

URL = f"http://{a.grpc}/tensorflow.serving.PredictionService/Predict"
LABELS = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def grpc_counts():
    """(OK, not OK) gRPC Predict requests of the model so far, all versions."""
    text = urllib.request.urlopen(f"http://{a.rest}/metrics", timeout=30).read().decode()
    ok = bad = 0
    for line in text.splitlines():
        if not line.startswith("kiln_requests_total{"):
            continue
        labels = dict(LABELS.findall(line[line.index("{") : line.rindex("}")]))
        if labels.get("protocol") != "grpc" or labels.get("api") != "predict" or labels.get("model") != a.model:
            continue
        n = float(line.rsplit(" ", 1)[1])
        if labels.get("code") == "OK":
            ok += n
        else:
            bad += n
    return ok, bad


def h2load(seconds, log=None):
    cmd = ["h2load", "-t", str(a.threads), "-c", str(a.clients), "-m", "1", "-D", f"{seconds:g}", "-d", a.body,
           "-H", "content-type: application/grpc", "-H", "te: trailers"]
    if log:
        cmd += ["--log-file", log]
    r = subprocess.run(cmd + [URL], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"serving_h2load: h2load failed ({r.returncode}): {r.stderr.strip() or r.stdout.strip()}")
    return r.stdout


def field(text, pattern):
    m = re.search(pattern, text)
    return float(m.group(1)) if m else 0.0


def percentile_ms(sorted_us, q):
    if not sorted_us:
        return 0.0
    return sorted_us[min(len(sorted_us) - 1, int(q / 100 * len(sorted_us)))] / 1000


if a.warmup > 0:
    h2load(a.warmup)
ok0, bad0 = grpc_counts()
def children_cpu_seconds():
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


with tempfile.NamedTemporaryFile(suffix=".h2load.log") as tmp:
    log = a.log or tmp.name
    cpu0 = children_cpu_seconds()
    out = h2load(a.seconds, log)
    cpu = children_cpu_seconds() - cpu0  # h2load's own, all its threads
    latencies = []
    for line in open(log):
        cols = line.split("\t")
        if len(cols) >= 3 and cols[1] == "200":
            latencies.append(int(cols[2]))
ok1, bad1 = grpc_counts()
latencies.sort()

done = field(out, r"requests: \d+ total, \d+ started, (\d+) done")
http_ok = field(out, r"(\d+) succeeded")
transport = field(out, r"(\d+) failed") + field(out, r"(\d+) errored") + field(out, r"(\d+) timeout")
ok_delta, bad_delta = ok1 - ok0, bad1 - bad0
# An HTTP 200 the server did not count as OK failed in gRPC terms; requests
# still in flight when h2load stops may add up to `clients` to ok_delta.
grpc_failed = min(max(http_ok - ok_delta, bad_delta, 0), http_ok)
ok = http_ok - grpc_failed
print(json.dumps({
    "generator": f"h2load -t{a.threads} -c{a.clients} -m1",
    "seconds": a.seconds,
    "done": int(done),
    "ok": int(ok),
    "failed": int(grpc_failed + transport),
    "grpc_ok_counted": int(ok_delta),
    "grpc_errors_counted": int(bad_delta),
    "qps": ok / a.seconds,
    "h2load_req_per_s": field(out, r"finished in [\d.]+\w+, ([\d.]+) req/s"),
    "generator_cpu_s": cpu,
    "generator_cpu_us_per_request": cpu * 1e6 / done if done else 0.0,
    "p50_ms": percentile_ms(latencies, 50),
    "p90_ms": percentile_ms(latencies, 90),
    "p99_ms": percentile_ms(latencies, 99),
    "max_ms": latencies[-1] / 1000 if latencies else 0.0,
}))
