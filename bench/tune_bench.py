#!/usr/bin/env python3
"""kiln's tuners against Optuna's TPE on one search space
(bench/tune_space.json), one trial budget and one external training program
(examples/tune_trial_mlp.cc), in one run. Prints a table, writes JSON.

  .venv/bin/python bench/tune_bench.py --trials 100 --epochs 3 --out build/bench/tune_bench.json

Runs: optuna_tpe (sequential, 2 threads per trial); kiln random and
bayesian (sequential, 2 threads per trial); kiln hyperband (max_epochs =
--epochs, --parallel 2, 1 thread per trial); kiln bayesian + median pruner
(--parallel 2, 1 thread per trial). For each: best val_accuracy after each
trial and at which wall time; then the time each kiln run needs to reach
Optuna's best-after-all-trials, as a ratio of the time Optuna needed.
"""
import argparse
import json
import os
import re
import sqlite3
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_kiln(name, kiln, program, space, tuner, trials, parallel, threads, workdir, pruner=None):
    spec = {"project_name": name, "directory": workdir, "tuner": tuner, "objective": "val_accuracy",
            "max_trials": trials, "seed": 1, "hyperparameters": space, "command": program,
            "parallel": parallel, "tensorboard": False}
    if pruner:
        spec["pruner"] = pruner
    path = os.path.join(workdir, name + ".json")
    with open(path, "w") as f:
        json.dump(spec, f)
    env = dict(os.environ, KILN_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads), OMP_WAIT_POLICY="PASSIVE")
    start = time.time()
    proc = subprocess.Popen([kiln, "tune", path, "--overwrite"], stdout=subprocess.PIPE, text=True, env=env)
    finished = []  # (trial_id, wall_s)
    for line in proc.stdout:
        m = re.match(r"Trial (\S+) (COMPLETED|STOPPED|FAILED|INVALID) in", line)
        if m:
            finished.append((m.group(1), time.time() - start))
    rc = proc.wait()
    wall = time.time() - start
    if rc != 0:
        sys.exit("kiln tune %s failed (exit %d)" % (name, rc))
    db = sqlite3.connect(os.path.join(workdir, name, "trials.db"))
    scores = {tid: score for tid, score in db.execute("SELECT trial_id, score FROM trials")}
    statuses = {tid: st for tid, st in db.execute("SELECT trial_id, status FROM trials")}
    rows, best = [], None
    for i, (tid, t) in enumerate(finished):
        s = scores.get(tid)
        if s is not None:
            best = s if best is None else max(best, s)
        rows.append({"number": i, "trial_id": tid, "value": s, "status": statuses.get(tid), "best_so_far": best,
                     "wall_s": round(t, 3)})
    return {"tuner": name, "trials": rows, "best": best, "wall_s": round(wall, 3),
            "pruned": sum(1 for s in statuses.values() if s == "STOPPED")}


def time_to_reach(result, target):
    for r in result["trials"]:
        if r["best_so_far"] is not None and r["best_so_far"] >= target - 1e-12:
            return r["wall_s"], r["number"] + 1
    return None, None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=100)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--train_samples", type=int, default=10000)
    p.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"))
    p.add_argument("--program", default=os.path.join(ROOT, "build", "examples", "example_tune_trial_mlp"))
    p.add_argument("--workdir", default=os.path.join(ROOT, "build", "bench", "tune_bench"))
    p.add_argument("--out", default=os.path.join(ROOT, "build", "bench", "tune_bench.json"))
    p.add_argument("--only", default="", help="comma-separated subset of runs")
    a = p.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    with open(os.path.join(ROOT, "bench", "tune_space.json")) as f:
        space = json.load(f)
    program = "%s --epochs=%d --train_samples=%d" % (a.program, a.epochs, a.train_samples)
    runs = {}
    only = set(filter(None, a.only.split(",")))

    def want(n):
        return not only or n in only

    if want("optuna_tpe"):
        out = os.path.join(a.workdir, "optuna.json")
        env = dict(os.environ, KILN_NUM_THREADS="2", OMP_NUM_THREADS="2", OMP_WAIT_POLICY="PASSIVE")
        subprocess.run([sys.executable, os.path.join(ROOT, "bench", "optuna_tune.py"), "--trials", str(a.trials),
                        "--out", out, "--"] + program.split(), check=True, env=env, stdout=subprocess.DEVNULL)
        with open(out) as f:
            runs["optuna_tpe"] = json.load(f)
    configs = [
        ("kiln_random", "random_search", 1, 2, None),
        ("kiln_bayesian", "bayesian", 1, 2, None),
        ("kiln_hyperband_p2", {"type": "hyperband", "max_epochs": a.epochs, "factor": 3}, 2, 1, None),
        ("kiln_bayesian_median_p2", "bayesian", 2, 1, {"type": "median", "n_startup_trials": 5}),
    ]
    for name, tuner, parallel, threads, pruner in configs:
        if want(name):
            print("running %s ..." % name, flush=True)
            runs[name] = run_kiln(name, a.kiln, program, space, tuner, a.trials, parallel, threads, a.workdir, pruner)

    target = runs["optuna_tpe"]["best"] if "optuna_tpe" in runs else None
    t_opt = time_to_reach(runs["optuna_tpe"], target)[0] if target is not None else None
    print("\n%-26s %7s %9s %8s %7s %14s %8s" % ("run", "trials", "best_acc", "wall_s", "pruned", "reach_optuna_s",
                                                 "ratio"))
    for name, r in runs.items():
        reach, n = time_to_reach(r, target) if target is not None else (None, None)
        ratio = reach / t_opt if reach is not None and t_opt else None
        r["reach_optuna_best_s"], r["reach_optuna_best_trials"], r["ratio_vs_optuna"] = reach, n, ratio
        print("%-26s %7d %9.4f %8.1f %7s %14s %8s" % (
            name, len(r["trials"]), r["best"] or 0, r["wall_s"], r.get("pruned", "-"),
            "-" if reach is None else "%.1f (%d)" % (reach, n), "-" if ratio is None else "%.2f" % ratio))
    result = {"trials": a.trials, "epochs": a.epochs, "train_samples": a.train_samples, "optuna_best": target,
              "optuna_time_to_best_s": t_opt, "runs": runs}
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print("\nwrote", a.out)


if __name__ == "__main__":
    main()
