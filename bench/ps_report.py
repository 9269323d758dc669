"""Helper of bench/ps_bench.sh (parameter-server training, issue #14).

    ps_report.py spec OUT.json --hidden 256,256 --limit N --epochs E --lr LR
                 --batch B --dist async|sync|data_parallel [--backup K] --base DIR
        writes a `kiln train` spec: an MLP 784-hidden...-10 (ReLU, logits),
        Fashion-MNIST (pixels / 255, flattened, the first N images), SGD.
    ps_report.py stamp MARK < job output > LOG
        copies each line with the seconds since it started in front, and
        at the end a line "@cpu {json}": the CPU seconds the job's `kiln
        train` processes (those whose command line holds MARK) used, per
        role (chief, worker, ps; rank), and the machine's busy CPU seconds,
        from the chief's "Epoch 1/" line to its last epoch line.
    ps_report.py result NAME LOG BATCH TARGET
        prints one JSON result line for the job's log.
    ps_report.py table RESULTS
        prints the table of the result lines.
"""

import json
import os
import re
import sys
import time

EPOCH_LINE = re.compile(r"^\[(chief0|rank0)\] (\d+)/(\d+) - (\d+)s - ([0-9.]+)(ms|us|s)/step - loss: ([0-9.naif]+)")
# training starts: the chief's first "Epoch 1/" line (Keras prints none for a
# single epoch) or, before it, its "Parameter servers: async training, ..." line
EPOCH_START = re.compile(r"^\[(chief0|rank0)\] (Epoch 1/\d+|Parameter servers: \w+ training,)")
SUMMARY = re.compile(
    r"^\[chief0\] Parameter servers: (\w+), (\d+) workers, (\d+) ps: (\d+) steps, (\d+) rescheduled, "
    r"(\d+) workers? lost \((\d+) restarts?\), (\d+) ps restores, (\d+) failed, (\d+) dropped, max staleness (\d+)"
)
BYTES = re.compile(
    r"^\[chief0\] Parameter servers: per worker step: ([0-9.]+) (B|KB|MB|GB) pulled, ([0-9.]+) (B|KB|MB|GB) "
    r"pushed; (\d+) worker steps in ([0-9.]+) s"
)
UNIT = {"B": 1, "KB": 2**10, "MB": 2**20, "GB": 2**30}  # the chief's "KB" are 1024 bytes


def spec(argv):
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--hidden", default="256,256")
    p.add_argument("--limit", type=int, required=True)
    p.add_argument("--test_limit", type=int, default=1000)
    p.add_argument("--epochs", type=int, required=True)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--dist", required=True)
    p.add_argument("--backup", type=int, default=0)
    p.add_argument("--base", required=True)
    a = p.parse_args(argv)
    layers = [
        {"class_name": "Dense", "config": {"units": int(u), "activation": "relu", "name": f"dense_{i}"}}
        for i, u in enumerate(a.hidden.split(","))
    ]
    layers.append({"class_name": "Dense", "config": {"units": 10, "name": "head"}})
    if a.dist == "data_parallel":
        dist = {"type": "data_parallel"}
    else:
        dist = {
            "type": "parameter_server",
            "mode": a.dist,
            "backup_workers": a.backup,
            "worker_timeout_seconds": 30,
        }
    s = {
        "model": {"layers": layers, "input_shape": [784], "name": "mlp"},
        "data": {
            "source": "fashion_mnist",
            "scale": "1/255",
            "flatten": True,
            "limit": a.limit,
            "test_limit": a.test_limit,
        },
        "compile": {
            "optimizer": {"class_name": "SGD", "config": {"learning_rate": a.lr}},
            "loss": {"class_name": "SparseCategoricalCrossentropy", "config": {"from_logits": True}},
            "metrics": ["accuracy"],
        },
        "fit": {"batch_size": a.batch, "epochs": a.epochs, "seed": 3, "verbose": 2},
        "distribution": dist,
        "output": {"base_dir": a.base},
    }
    with open(a.out, "w") as f:
        json.dump(s, f, indent=1)


def job_cpu(mark):
    """CPU seconds per role of the processes whose command line holds mark."""
    tick = os.sysconf("SC_CLK_TCK")
    roles = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            if mark.encode() not in cmd or b"train" not in cmd:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if b"TF_CONFIG" in env:
            role = json.loads(env[b"TF_CONFIG"])["task"]["type"]
        else:
            role = "rank"
        roles[pid] = (role, (int(fields[11]) + int(fields[12])) / tick)
    return roles


def machine_busy():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait


def stamp(argv):
    mark = argv[0]
    t0 = time.monotonic()
    first = last = None
    inp = sys.stdin.buffer
    while True:
        raw = inp.readline()
        if not raw:
            break
        line = raw.decode("utf-8", "replace").rstrip("\n")
        t = time.monotonic() - t0
        sys.stdout.write(f"{t:.3f} {line}\n")
        sys.stdout.flush()
        if first is None and EPOCH_START.match(line):
            first = (t, job_cpu(mark), machine_busy())
        elif first is not None and EPOCH_LINE.match(line):
            last = (t, job_cpu(mark), machine_busy())
    if first and last:
        cpu = {}
        for pid, (role, s) in last[1].items():
            if pid in first[1]:
                cpu[role] = cpu.get(role, 0) + s - first[1][pid][1]
        cpu["wall"] = last[0] - first[0]
        cpu["machine"] = last[2] - first[2]
        sys.stdout.write("@cpu " + json.dumps(cpu) + "\n")


def result(argv):
    name, log, batch, target = argv[0], argv[1], int(argv[2]), float(argv[3])
    r = {"name": name, "epochs": [], "ok": False}
    start = None
    for line in open(log):
        if line.startswith("@cpu "):
            r["cpu"] = json.loads(line[5:])
            continue
        t, _, text = line.rstrip("\n").partition(" ")
        if start is None and EPOCH_START.match(text):
            start = r["startup_s"] = float(t)  # seconds from the launch to the training's start
        m = EPOCH_LINE.match(text)
        if m and start is not None:
            step = float(m.group(5)) * {"ms": 1e-3, "us": 1e-6, "s": 1}[m.group(6)]
            r["epochs"].append({"t": float(t) - start, "steps": int(m.group(3)), "step_s": step, "loss": float(m.group(7))})
        m = SUMMARY.match(text)
        if m:
            r.update(
                mode=m.group(1),
                workers=int(m.group(2)),
                ps=int(m.group(3)),
                steps=int(m.group(4)),
                rescheduled=int(m.group(5)),
                lost=int(m.group(6)),
                failed=int(m.group(9)),
                dropped=int(m.group(10)),
                staleness=int(m.group(11)),
            )
        m = BYTES.match(text)
        if m:
            r.update(
                pulled=float(m.group(1)) * UNIT[m.group(2)],
                pushed=float(m.group(3)) * UNIT[m.group(4)],
                worker_steps=int(m.group(5)),
                train_s=float(m.group(6)),
            )
    e = r["epochs"]
    if start is None:
        r["why"] = "no training start line (DataParallel prints no 'Epoch 1/1': run 2 epochs or more)"
    if e:
        r["stamped_s"] = e[-1]["t"]
        if "worker_steps" in r:  # parameter servers: the chief's figures
            r["examples"] = r["worker_steps"] * batch
            r["ex_per_s"] = r["examples"] / r["train_s"]
            r["ps_MBps"] = (r["pulled"] + r["pushed"]) * r["worker_steps"] / r["train_s"] / 1e6
            r["ok"] = True
        else:  # data parallel: batch is the global batch
            steps = sum(x["steps"] for x in e)
            r["examples"] = steps * batch
            r["train_s"] = r["stamped_s"]
            r["ex_per_s"] = r["examples"] / r["train_s"]
            # the progbar's ms/step (whole ms), epochs after the first
            rest = e[1:] or e
            r["progbar_ex_per_s"] = batch / (sum(x["step_s"] for x in rest) / len(rest))
            r["ok"] = True
        hit = next((i for i, x in enumerate(e) if x["loss"] < target), None)
        if hit is not None:
            r["target_epoch"] = hit + 1
            r["target_s"] = e[hit]["t"]
        r["final_loss"] = e[-1]["loss"]
    print(json.dumps(r))


def table(argv):
    rows = [json.loads(line) for line in open(argv[0]) if line.startswith("{")]
    target = argv[1] if len(argv) > 1 else "?"
    print(
        f"{'configuration':<34} {'train s':>7} {'examples/s':>10} {'vs 1':>5} {'KiB/step':>8} {'ps MB/s':>8} "
        f"{'cores (chief+workers/ps)':>24} {'machine':>7} {'loss<' + target:>12} {'final':>6} {'start s':>7}"
    )
    base = {}
    for r in rows:
        if not r.get("ok"):
            print(f"{r['name']:<34} (failed: no result{': ' + r['why'] if 'why' in r else ''})")
            continue
        group = r["name"].split()[0] + (" big" if "big" in r["name"] else "")
        base.setdefault(group, r["ex_per_s"])
        cpu = r.get("cpu", {})
        wall = cpu.get("wall") or 1
        comp = (cpu.get("chief", 0) + cpu.get("worker", 0) + cpu.get("rank", 0)) / wall
        ps = cpu.get("ps", 0) / wall
        cores = f"{comp:.2f}/{ps:.2f}" if "ps" in cpu else f"{comp:.2f}"
        kb = f"{(r['pulled'] + r['pushed']) / 2**10:.0f}" if "pulled" in r else "-"
        mbps = f"{r['ps_MBps']:.0f}" if "ps_MBps" in r else "-"
        tt = f"{r['target_s']:.1f}s e{r['target_epoch']}" if "target_s" in r else "not reached"
        extra = ""
        if r.get("lost") or r.get("failed") or r.get("rescheduled"):
            extra = f"  ({r['lost']} lost, {r['rescheduled']} rescheduled, {r['failed']} failed)"
        if r.get("dropped"):  # sync with backup workers: the stragglers' gradients
            applied = (r["worker_steps"] - r["dropped"]) * r["examples"] / r["worker_steps"] / r["train_s"]
            extra += f"  ({r['dropped']} of {r['worker_steps']} worker steps dropped: {applied:.0f} applied examples/s)"
        if "progbar_ex_per_s" in r:
            extra += f"  (progbar ms/step: {r['progbar_ex_per_s']:.0f}/s)"
        if "staleness" in r and r["mode"] == "async":
            extra += f"  staleness<={r['staleness']}"
        print(
            f"{r['name']:<34} {r['train_s']:>7.1f} {r['ex_per_s']:>10.0f} {r['ex_per_s'] / base[group]:>5.2f} "
            f"{kb:>8} {mbps:>8} {cores:>24} {cpu.get('machine', 0) / wall:>7.2f} {tt:>12} "
            f"{r['final_loss']:>6.3f} {r['startup_s']:>7.1f}{extra}"
        )


if __name__ == "__main__":
    {"spec": spec, "stamp": stamp, "result": result, "table": table}[sys.argv[1]](sys.argv[2:])
