#!/usr/bin/env python3
"""Optuna's TPE over the same search space and the same external training
program as `kiln tune` (bench/tune_bench.sh): each trial runs the program
as a subprocess with --name=value flags and reads its
"kiln-metric val_accuracy=... step=N" lines; the trial's value is the best
epoch's val_accuracy (as kiln scores a trial).

  .venv/bin/python bench/optuna_tune.py --trials 100 --out optuna.json \
      -- build/examples/example_tune_trial_mlp --epochs=3

Writes JSON: {"tuner": "optuna_tpe", "trials": [{"number", "value",
"best_so_far", "wall_s", "params"}], "best", "wall_s"}.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import optuna

# The search space of bench/tune_space.json, in Optuna's words.
def suggest(trial):
    return {
        "units": trial.suggest_int("units", 32, 256, step=32),
        "num_layers": trial.suggest_int("num_layers", 1, 2),
        "learning_rate": trial.suggest_float("learning_rate", 1e-4, 1e-2, log=True),
        "dropout": trial.suggest_float("dropout", 0.0, 0.5),
    }


def run_program(command, params):
    args = command + ["--%s=%s" % (k, repr(v) if isinstance(v, float) else v) for k, v in params.items()]
    proc = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    best = None
    for line in proc.stdout.splitlines():
        if not line.startswith("kiln-metric "):
            continue
        for tok in line.split()[1:]:
            name, _, value = tok.partition("=")
            if name == "val_accuracy":
                v = float(value)
                best = v if best is None else max(best, v)
    if proc.returncode != 0 or best is None:
        raise RuntimeError("trial program failed: %s" % proc.stderr.strip()[-300:])
    return best


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=100)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default="optuna_tune.json")
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args()
    command = [c for c in a.command if c != "--"]
    if not command:
        sys.exit("optuna_tune.py: give the trial program after --")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=a.seed))
    start = time.time()
    rows = []
    best = None

    def objective(trial):
        nonlocal best
        params = suggest(trial)
        v = run_program(command, params)
        best = v if best is None else max(best, v)
        rows.append({"number": trial.number, "value": v, "best_so_far": best,
                     "wall_s": round(time.time() - start, 3), "params": params})
        print("optuna trial %d: val_accuracy=%.4f best=%.4f at %.1fs" % (trial.number, v, best, time.time() - start),
              flush=True)
        return v

    study.optimize(objective, n_trials=a.trials)
    out = {"tuner": "optuna_tpe", "optuna_version": optuna.__version__, "trials": rows, "best": best,
           "wall_s": round(time.time() - start, 3)}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
