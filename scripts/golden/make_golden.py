#!/usr/bin/env python3
"""Golden data for kiln's losses, metrics, optimizers and schedules.

An independent reference written with PyTorch (run with .venv/bin/python; the values were generated with Debian's torch 1.13):
torch.nn.functional losses where their semantics equal Keras's, and plain
torch ops following Keras 3's documented formulas elsewhere; torch.optim.SGD
where its rule equals Keras's, reference loops for the rest (Keras puts
epsilon differently from torch in RMSprop and Adam), each loop checked here
against torch.optim with epsilon=0, where the two rules coincide.

Run from the repository root:
    /usr/bin/python3 scripts/golden/make_golden.py
It rewrites kiln/{losses,metrics,optimizers}/testdata/*_golden.json and
kiln/layers/testdata/new_layers_golden.json (`make_golden.py layers` writes
only the last). The inputs are generated with a fixed seed and stored next
to the results.
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

EPS = 1e-7  # Keras's backend.epsilon()
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GEN = torch.Generator().manual_seed(20240611)


def randn(*shape, scale=1.0):
    return (torch.randn(*shape, generator=GEN) * scale).float()


def rand(*shape):
    return torch.rand(*shape, generator=GEN).float()


def randint(lo, hi, *shape):
    return torch.randint(lo, hi, shape, generator=GEN)


def T(t):
    """A tensor as {"shape", "dtype", "data"} (flat, row-major)."""
    t = t.detach()
    dtype = {torch.float32: "float32", torch.float64: "float64", torch.int64: "int64"}[t.dtype]
    data = t.reshape(-1).tolist()
    if t.dtype == torch.float32:
        # Shortest decimal that reads back as the same float32.
        data = [float(repr(np.float32(x))) for x in data]
    return {"shape": list(t.shape), "dtype": dtype, "data": data}


def write(rel, obj):
    path = os.path.join(ROOT, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # One case per line: small files, readable diffs.
    with open(path, "w") as f:
        f.write("{\n")
        items = list(obj.items())
        for i, (key, value) in enumerate(items):
            f.write(json.dumps(key) + ": ")
            if isinstance(value, list):
                f.write("[\n" + ",\n".join(json.dumps(v, separators=(",", ":")) for v in value) + "\n]")
            else:
                f.write(json.dumps(value))
            f.write(",\n" if i + 1 < len(items) else "\n")
        f.write("}\n")
    print("wrote", rel)


# ----------------------------------------------------------------------------
# Losses (float32, as Keras computes them)
# ----------------------------------------------------------------------------

def squeeze_or_expand(x1, x2, expand_rank_1=True):
    r1, r2 = x1.dim(), x2.dim()
    if r1 == r2:
        return x1, x2
    if r1 == r2 + 1 and x1.shape[-1] == 1:
        if r2 == 1 and expand_rank_1:
            x2 = x2.unsqueeze(-1)
        else:
            x1 = x1.squeeze(-1)
    if r2 == r1 + 1 and x2.shape[-1] == 1:
        if r1 == 1 and expand_rank_1:
            x1 = x1.unsqueeze(-1)
        else:
            x2 = x2.squeeze(-1)
    return x1, x2


def reduce(values, weight, reduction, mask=None):
    """Keras 3's reduce_weighted_values."""
    if mask is not None:
        mask = mask.float()
        if reduction in ("sum_over_batch_size", "mean"):
            mask = mask * (mask.numel() / (mask.sum() + EPS))
        weight = mask if weight is None else weight * mask
    if weight is not None:
        values, weight = squeeze_or_expand(values, weight.float())
        while weight.dim() < values.dim() and weight.dim() > 0:
            weight = weight.unsqueeze(-1)
        values = values * weight
    if reduction == "none":
        return values
    total = values.sum()
    if reduction in ("sum_over_batch_size", "mean"):
        return total / values.numel()
    if reduction == "mean_with_sample_weight":
        div = weight.expand_as(values).sum() if weight is not None else torch.tensor(float(values.numel()))
        return total / div
    return total


def clipped_log(p):
    return torch.log(p.clamp(EPS, 1 - EPS))


def loss_cases():
    cases = []

    def add(name, cls, config, y_true, y_pred, per_sample, sample_weight=None, mask=None):
        reduction = config.get("reduction", "sum_over_batch_size")
        expected = reduce(per_sample, sample_weight, reduction, mask)
        cases.append({
            "name": name,
            "loss": {"class_name": cls, "config": config},
            "y_true": T(y_true),
            "y_pred": T(y_pred),
            "sample_weight": None if sample_weight is None else T(sample_weight),
            "per_sample": T(per_sample),
            "expected": T(expected),
        })

    n, c = 8, 5
    # Sparse CE on probabilities, with rows that hit both clip bounds.
    probs = torch.softmax(randn(n, c, scale=2.0), -1)
    labels = randint(0, c, n)
    probs[0] = torch.tensor([1.0, 0, 0, 0, 0])
    labels[0] = 1  # p = 0 -> clipped to 1e-7
    probs[1] = torch.tensor([0.0, 0, 1.0, 0, 0])
    labels[1] = 2  # p = 1 -> clipped to 1 - 1e-7
    per = F.nll_loss(clipped_log(probs / probs.sum(-1, keepdim=True)), labels, reduction="none")
    add("scce_probs", "SparseCategoricalCrossentropy", {}, labels, probs, per)
    weights = rand(n) * 2
    for red in ["sum", "none", "mean", "mean_with_sample_weight", "sum_over_batch_size"]:
        add("scce_probs_weighted_" + red, "SparseCategoricalCrossentropy", {"reduction": red}, labels, probs, per,
            sample_weight=weights)

    logits = randn(n, c, scale=3.0)
    labels = randint(0, c, n)
    per = F.cross_entropy(logits, labels, reduction="none")
    add("scce_logits_labels_n1", "SparseCategoricalCrossentropy", {"from_logits": True}, labels.reshape(n, 1),
        logits, per)
    add("scce_logits_weights_n1", "SparseCategoricalCrossentropy", {"from_logits": True}, labels, logits, per,
        sample_weight=weights.reshape(n, 1))
    # Sequence of labels (batch, time).
    seq_logits = randn(3, 4, c)
    seq_labels = randint(0, c, 3, 4)
    per = F.cross_entropy(seq_logits.permute(0, 2, 1), seq_labels, reduction="none")
    add("scce_logits_sequence", "SparseCategoricalCrossentropy", {"from_logits": True}, seq_labels, seq_logits, per,
        sample_weight=torch.tensor([1.0, 0.5, 2.0]))
    # ignore_class: masked entries contribute 0 and do not count.
    ign = labels.clone()
    ign[[1, 4, 5]] = -1
    valid = ign != -1
    per = torch.where(valid, F.cross_entropy(logits, ign.clamp(min=0), reduction="none"), torch.zeros(()))
    add("scce_ignore_class", "SparseCategoricalCrossentropy", {"from_logits": True, "ignore_class": -1}, ign, logits,
        per, mask=valid)
    add("scce_ignore_class_sum", "SparseCategoricalCrossentropy",
        {"from_logits": True, "ignore_class": -1, "reduction": "sum"}, ign, logits, per, mask=valid)

    # Categorical CE: unnormalised probabilities (renormalised), smoothing.
    raw = rand(n, c) + 0.05
    onehot = F.one_hot(randint(0, c, n), c).float()
    for ls in [0.0, 0.1]:
        t = onehot * (1 - ls) + ls / c
        per = -(t * clipped_log(raw / raw.sum(-1, keepdim=True))).sum(-1)
        add("cce_probs_ls%.1f" % ls, "CategoricalCrossentropy", {"label_smoothing": ls}, onehot, raw, per)
    soft = torch.softmax(randn(n, c), -1)
    for ls in [0.0, 0.2]:
        per = F.cross_entropy(logits, soft, label_smoothing=ls, reduction="none")
        add("cce_logits_soft_ls%.1f" % ls, "CategoricalCrossentropy", {"from_logits": True, "label_smoothing": ls},
            soft, logits, per, sample_weight=weights)

    # Binary CE.
    yb = randint(0, 2, n, 3).float()
    pb = torch.sigmoid(randn(n, 3, scale=2.0))
    pb[0, 0], yb[0, 0] = 0.0, 1.0
    pb[0, 1], yb[0, 1] = 1.0, 0.0
    pb[0, 2], yb[0, 2] = 1.0, 1.0
    for ls in [0.0, 0.1]:
        t = yb * (1 - ls) + 0.5 * ls
        per = F.binary_cross_entropy(pb.clamp(EPS, 1 - EPS), t, reduction="none").mean(-1)
        add("bce_probs_ls%.1f" % ls, "BinaryCrossentropy", {"label_smoothing": ls}, yb, pb, per)
    xb = randn(n, 3, scale=4.0)
    for ls in [0.0, 0.1]:
        t = yb * (1 - ls) + 0.5 * ls
        per = F.binary_cross_entropy_with_logits(xb, t, reduction="none").mean(-1)
        add("bce_logits_ls%.1f" % ls, "BinaryCrossentropy", {"from_logits": True, "label_smoothing": ls}, yb, xb,
            per, sample_weight=weights)
    # y_true (N,) against y_pred (N, 1).
    y1 = randint(0, 2, n).float()
    x1 = randn(n, 1, scale=2.0)
    per = F.binary_cross_entropy_with_logits(x1, y1.unsqueeze(-1), reduction="none").mean(-1)
    add("bce_logits_n_vs_n1", "BinaryCrossentropy", {"from_logits": True}, y1, x1, per)

    # Regression.
    yt = randn(n, 4)
    yp = yt + randn(n, 4, scale=1.5)
    add("mse", "MeanSquaredError", {}, yt, yp, F.mse_loss(yp, yt, reduction="none").mean(-1))
    add("mae", "MeanAbsoluteError", {}, yt, yp, F.l1_loss(yp, yt, reduction="none").mean(-1))
    add("huber", "Huber", {}, yt, yp, F.huber_loss(yp, yt, delta=1.0, reduction="none").mean(-1))
    add("huber_delta0.5_sum", "Huber", {"delta": 0.5, "reduction": "sum"}, yt, yp,
        F.huber_loss(yp, yt, delta=0.5, reduction="none").mean(-1), sample_weight=weights)
    add("mse_weights_n1_none", "MeanSquaredError", {"reduction": "none"}, yt, yp,
        F.mse_loss(yp, yt, reduction="none").mean(-1), sample_weight=weights.reshape(n, 1))
    y3 = randn(2, 3, 4)
    p3 = randn(2, 3, 4)
    add("mae_rank3_weighted", "MeanAbsoluteError", {}, y3, p3, F.l1_loss(p3, y3, reduction="none").mean(-1),
        sample_weight=torch.tensor([0.25, 2.0]))
    yv = randn(n)
    pv = randn(n, 1)
    add("mse_n_vs_n1", "MeanSquaredError", {}, yv, pv, F.mse_loss(pv, yv.unsqueeze(-1), reduction="none").mean(-1))
    return cases


# ----------------------------------------------------------------------------
# Metrics (accumulated in float64 over several batches)
# ----------------------------------------------------------------------------

def weighted_mean_update(state, values, weight):
    """Keras's Mean over per-sample values (values already (N,) or (N, k))."""
    values = values.double()
    if weight is not None:
        w = weight.double()
        values, w = squeeze_or_expand(values, w)
        if values.dim() > w.dim():
            values = values.mean(dim=tuple(range(w.dim(), values.dim())))
        w = w.expand_as(values)
        values = values * w
        if w.dim() > 1:
            w = w.mean(dim=tuple(range(1, w.dim())))
        cnt = w.sum().item()
    else:
        cnt = values.shape[0]
    if values.dim() > 1:
        values = values.mean(dim=tuple(range(1, values.dim())))
    state[0] += values.sum().item()
    state[1] += cnt
    return state[0] / state[1] if state[1] else 0.0


def in_top_k_by_rank(labels, scores, k):
    """Hit when fewer than k classes score strictly higher than the target."""
    target = scores.gather(-1, labels.unsqueeze(-1))
    higher = (scores > target).sum(-1)
    return (higher < k).float()


def confusion(y, p, w, thresholds):
    """Weighted tp, fp, tn, fn at each threshold (prediction > threshold)."""
    y = (y != 0).reshape(-1).double()  # Keras casts labels to bool
    p = p.reshape(-1).double()
    w = torch.ones_like(y) if w is None else w.reshape(-1).double()
    above = (p.unsqueeze(0) > thresholds.unsqueeze(1)).double()
    tp = above @ (y * w)
    fp = above @ ((1 - y) * w)
    fn = (1 - above) @ (y * w)
    tn = (1 - above) @ ((1 - y) * w)
    return torch.stack([tp, fp, tn, fn])


def div0(a, b):
    return torch.where(b == 0, torch.zeros_like(a), a / torch.where(b == 0, torch.ones_like(b), b))


def auc_result(cm, curve, method):
    tp, fp, tn, fn = cm
    n = tp.shape[0]
    if curve == "PR" and method == "interpolation":
        dtp = tp[:-1] - tp[1:]
        p = tp + fp
        dp = p[:-1] - p[1:]
        slope = div0(dtp, dp.clamp(min=0))
        intercept = tp[1:] - slope * p[1:]
        ratio = torch.where((p[:-1] > 0) & (p[1:] > 0), div0(p[:-1], p[1:].clamp(min=0)), torch.ones_like(p[1:]))
        return div0(slope * (dtp + intercept * torch.log(ratio)), (tp[1:] + fn[1:]).clamp(min=0)).sum().item()
    recall = div0(tp, tp + fn)
    if curve == "ROC":
        x, y = div0(fp, fp + tn), recall
    else:
        x, y = recall, div0(tp, tp + fp)
    if method == "interpolation":
        h = (y[:-1] + y[1:]) / 2
    elif method == "minoring":
        h = torch.minimum(y[:-1], y[1:])
    else:
        h = torch.maximum(y[:-1], y[1:])
    return ((x[:-1] - x[1:]) * h).sum().item()


def auc_thresholds(n):
    # float32, as Keras compares float32 predictions with them.
    inner = [(i + 1) / (n - 1) for i in range(n - 2)]
    return torch.tensor([0.0 - EPS] + inner + [1.0 + EPS], dtype=torch.float32).double()


def metric_cases():
    cases = []

    def add(name, cls, config, batches, results):
        cases.append({
            "name": name,
            "metric": {"class_name": cls, "config": config},
            "batches": [{"y_true": T(b[0]), "y_pred": T(b[1]), "sample_weight": None if b[2] is None else T(b[2])}
                        for b in batches],
            "results": results,
        })

    nb, n, c = 3, 10, 6

    def mean_metric(name, cls, config, batches, fn):
        state = [0.0, 0.0]
        results = [weighted_mean_update(state, fn(b[0], b[1]), b[2]) for b in batches]
        add(name, cls, config, batches, results)

    # Binary accuracy, (N, 1) predictions with (N,) labels, weights.
    batches = []
    for i in range(nb):
        batches.append((randint(0, 2, n).float(), rand(n, 1), rand(n) if i != 1 else None))
    mean_metric("binary_accuracy", "BinaryAccuracy", {}, batches,
                lambda y, p: ((p > 0.5).float() == y.unsqueeze(-1)).float())
    mean_metric("binary_accuracy_t0.3", "BinaryAccuracy", {"threshold": 0.3}, batches,
                lambda y, p: ((p > 0.3).float() == y.unsqueeze(-1)).float())
    # Multi-output binary accuracy averages per sample.
    batches = [(randint(0, 2, n, 3).float(), rand(n, 3), rand(n)) for _ in range(nb)]
    mean_metric("binary_accuracy_multi", "BinaryAccuracy", {}, batches,
                lambda y, p: ((p > 0.5).float() == y).float())

    # Categorical / sparse categorical / top-k.
    batches = []
    for i in range(nb):
        labels = randint(0, c, n)
        batches.append((labels, torch.softmax(randn(n, c), -1), rand(n) * 2 if i != 0 else None))
    mean_metric("sparse_categorical_accuracy", "SparseCategoricalAccuracy", {}, batches,
                lambda y, p: (p.argmax(-1) == y).float())
    mean_metric("sparse_top_k_k2", "SparseTopKCategoricalAccuracy", {"k": 2}, batches,
                lambda y, p: in_top_k_by_rank(y, p, 2))
    mean_metric("sparse_top_k_default", "SparseTopKCategoricalAccuracy", {}, batches,
                lambda y, p: in_top_k_by_rank(y, p, 5))
    onehot_batches = [(F.one_hot(b[0], c).float(), b[1], b[2]) for b in batches]
    mean_metric("categorical_accuracy", "CategoricalAccuracy", {}, onehot_batches,
                lambda y, p: (p.argmax(-1) == y.argmax(-1)).float())
    mean_metric("top_k_k3", "TopKCategoricalAccuracy", {"k": 3}, onehot_batches,
                lambda y, p: in_top_k_by_rank(y.argmax(-1), p, 3))
    n1_batches = [(b[0].reshape(n, 1), b[1], b[2]) for b in batches]
    mean_metric("sparse_categorical_accuracy_n1", "SparseCategoricalAccuracy", {}, n1_batches,
                lambda y, p: (p.argmax(-1) == y.squeeze(-1)).float())

    # Regression metrics.
    batches = [(randn(n, 2), randn(n, 2), rand(n) if i != 2 else None) for i in range(nb)]
    mean_metric("mae", "MeanAbsoluteError", {}, batches, lambda y, p: (p - y).abs().mean(-1))
    mean_metric("mse", "MeanSquaredError", {}, batches, lambda y, p: ((p - y) ** 2).mean(-1))

    # Confusion-matrix metrics: labels correlated with the scores.
    batches = []
    for i in range(nb):
        y = randint(0, 2, 40).float()
        p = torch.sigmoid(2.0 * (y * 2 - 1) + randn(40, scale=1.5))
        batches.append((y, p, rand(40) if i != 1 else None))

    def confusion_metric(name, cls, config, thresholds, batches, result_fn, logits=False):
        cm = torch.zeros(4, thresholds.shape[0], dtype=torch.float64)
        results = []
        for y, p, w in batches:
            pp = torch.sigmoid(p) if logits else p
            cm += confusion(y, pp.clamp(0, 1), w, thresholds)
            results.append(result_fn(cm))
        add(name, cls, config, batches, results)

    half = torch.tensor([0.5], dtype=torch.float32).double()
    confusion_metric("precision", "Precision", {}, half, batches, lambda cm: div0(cm[0], cm[0] + cm[1]).item())
    confusion_metric("recall", "Recall", {}, half, batches, lambda cm: div0(cm[0], cm[0] + cm[3]).item())
    t3 = torch.tensor([0.3], dtype=torch.float32).double()
    confusion_metric("precision_t0.3", "Precision", {"thresholds": 0.3}, t3, batches,
                     lambda cm: div0(cm[0], cm[0] + cm[1]).item())
    confusion_metric("recall_t0.3", "Recall", {"thresholds": [0.3]}, t3, batches,
                     lambda cm: div0(cm[0], cm[0] + cm[3]).item())
    for curve, method in [("ROC", "interpolation"), ("ROC", "minoring"), ("ROC", "majoring"),
                          ("PR", "interpolation"), ("PR", "minoring"), ("PR", "majoring")]:
        thr = auc_thresholds(200)
        confusion_metric("auc_%s_%s" % (curve, method), "AUC", {"curve": curve, "summation_method": method}, thr,
                         batches, lambda cm, curve=curve, method=method: auc_result(cm, curve, method))
    thr = auc_thresholds(13)
    confusion_metric("auc_roc_13_thresholds", "AUC", {"num_thresholds": 13}, thr, batches,
                     lambda cm: auc_result(cm, "ROC", "interpolation"))
    custom = [0.1, 0.25, 0.5, 0.6, 0.9]
    thr = torch.tensor([0.0 - EPS] + custom + [1.0 + EPS], dtype=torch.float32).double()
    confusion_metric("auc_custom_thresholds", "AUC", {"thresholds": custom}, thr, batches,
                     lambda cm: auc_result(cm, "ROC", "interpolation"))
    logit_batches = [(y, torch.logit(p), w) for y, p, w in batches]
    confusion_metric("auc_from_logits", "AUC", {"from_logits": True}, auc_thresholds(200), logit_batches,
                     lambda cm: auc_result(cm, "ROC", "interpolation"), logits=True)

    # Precision with class_id on (N, C) multi-label predictions.
    batches = [(randint(0, 2, n, 3).float(), rand(n, 3), rand(n)) for _ in range(nb)]
    cm = torch.zeros(4, 1, dtype=torch.float64)
    results = []
    for y, p, w in batches:
        cm += confusion(y[:, 1], p[:, 1], w, half)
        results.append(div0(cm[0], cm[0] + cm[1]).item())
    add("precision_class_id1", "Precision", {"class_id": 1}, batches, results)
    return cases


# ----------------------------------------------------------------------------
# Schedules (float64, Keras 3's formulas)
# ----------------------------------------------------------------------------

class ExponentialDecay:
    def __init__(self, initial_learning_rate, decay_steps, decay_rate, staircase=False):
        self.cfg = dict(initial_learning_rate=initial_learning_rate, decay_steps=decay_steps, decay_rate=decay_rate,
                        staircase=staircase)

    def __call__(self, step):
        c = self.cfg
        p = step / c["decay_steps"]
        if c["staircase"]:
            p = math.floor(p)
        return c["initial_learning_rate"] * c["decay_rate"] ** p

    def to_json(self):
        return {"class_name": "ExponentialDecay", "config": self.cfg}


class CosineDecay:
    def __init__(self, initial_learning_rate, decay_steps, alpha=0.0, warmup_target=None, warmup_steps=0):
        self.cfg = dict(initial_learning_rate=initial_learning_rate, decay_steps=decay_steps, alpha=alpha,
                        warmup_target=warmup_target, warmup_steps=warmup_steps)

    def __call__(self, step):
        c = self.cfg

        def decay(s, from_lr):
            cos = 0.5 * (1.0 + math.cos(math.pi * s / c["decay_steps"]))
            return from_lr * ((1 - c["alpha"]) * cos + c["alpha"])

        if c["warmup_target"] is None:
            return decay(min(step, c["decay_steps"]), c["initial_learning_rate"])
        step = min(step, c["decay_steps"] + c["warmup_steps"])
        if step < c["warmup_steps"]:
            frac = step / c["warmup_steps"]
            return (c["warmup_target"] - c["initial_learning_rate"]) * frac + c["initial_learning_rate"]
        return decay(step - c["warmup_steps"], c["warmup_target"])

    def to_json(self):
        return {"class_name": "CosineDecay", "config": self.cfg}


class PiecewiseConstantDecay:
    def __init__(self, boundaries, values):
        self.cfg = dict(boundaries=boundaries, values=values)

    def __call__(self, step):
        b, v = self.cfg["boundaries"], self.cfg["values"]
        if step <= b[0]:
            return v[0]
        if step > b[-1]:
            return v[-1]
        for lo, hi, val in zip(b[:-1], b[1:], v[1:-1]):
            if lo < step <= hi:
                return val
        raise AssertionError

    def to_json(self):
        return {"class_name": "PiecewiseConstantDecay", "config": self.cfg}


def schedule_cases():
    scheds = [
        ExponentialDecay(0.1, 3, 0.5),
        ExponentialDecay(0.1, 3, 0.5, staircase=True),
        CosineDecay(0.2, 10),
        CosineDecay(0.2, 10, alpha=0.25),
        CosineDecay(0.0, 6, alpha=0.1, warmup_target=0.3, warmup_steps=4),
        CosineDecay(0.01, 5, warmup_target=0.1, warmup_steps=3),
        PiecewiseConstantDecay([2, 5], [1.0, 0.5, 0.1]),
        PiecewiseConstantDecay([3], [0.3, 0.03]),
    ]
    steps = list(range(0, 16))
    return [{"schedule": s.to_json(), "steps": steps, "values": [s(t) for t in steps]} for s in scheds]


# ----------------------------------------------------------------------------
# Optimizers (float32 variables, reference loops with Keras 3's rules)
# ----------------------------------------------------------------------------

def clip(grads, cfg):
    if cfg.get("clipnorm"):
        cn = cfg["clipnorm"]
        return [g * cn / torch.clamp(g.square().sum().sqrt(), min=cn) for g in grads]
    if cfg.get("global_clipnorm"):
        cn = cfg["global_clipnorm"]
        norm = torch.sqrt(sum(g.square().sum() for g in grads))
        scale = cn * torch.minimum(1.0 / norm, torch.tensor(1.0 / cn))
        return [g * scale for g in grads]
    if cfg.get("clipvalue"):
        v = cfg["clipvalue"]
        return [g.clamp(-v, v) for g in grads]
    return grads


def lr_at(cfg, sched, it):
    return sched(it) if sched is not None else cfg["learning_rate"]


def keras_reference(cls, cfg, sched, params, grad_steps):
    """Keras 3's apply(): clip -> weight decay -> update_step; float32."""
    params = [p.clone() for p in params]
    slots = {}
    out = []
    for it, grads in enumerate(grad_steps):
        grads = clip([g.clone() for g in grads], cfg)
        lr = lr_at(cfg, sched, it)
        wd = cfg.get("weight_decay", 0.004 if cls == "AdamW" else None)
        if wd:
            for p in params:
                p -= p * (wd * lr)
        t = it + 1
        for i, (p, g) in enumerate(zip(params, grads)):
            s = slots.setdefault(i, {})
            if cls == "SGD":
                mom = cfg.get("momentum", 0.0)
                if mom:
                    m = s.setdefault("m", torch.zeros_like(p))
                    m.copy_(m * mom - g * lr)
                    if cfg.get("nesterov"):
                        p += m * mom - g * lr
                    else:
                        p += m
                else:
                    p -= g * lr
            elif cls == "RMSprop":
                rho, mom, eps = cfg.get("rho", 0.9), cfg.get("momentum", 0.0), cfg.get("epsilon", 1e-7)
                v = s.setdefault("v", torch.zeros_like(p))
                v.copy_(rho * v + (1 - rho) * g * g)
                if cfg.get("centered"):
                    a = s.setdefault("a", torch.zeros_like(p))
                    a.copy_(rho * a + (1 - rho) * g)
                    den = v - a * a + eps
                else:
                    den = v + eps
                inc = lr * g / torch.sqrt(den)
                if mom > 0:
                    m = s.setdefault("m", torch.zeros_like(p))
                    m.copy_(mom * m + inc)
                    p -= m
                else:
                    p -= inc
            elif cls in ("Adam", "AdamW"):
                b1, b2, eps = cfg.get("beta_1", 0.9), cfg.get("beta_2", 0.999), cfg.get("epsilon", 1e-7)
                alpha = lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
                m = s.setdefault("m", torch.zeros_like(p))
                v = s.setdefault("v", torch.zeros_like(p))
                m += (g - m) * (1 - b1)
                v += (g * g - v) * (1 - b2)
                if cfg.get("amsgrad"):
                    vh = s.setdefault("vh", torch.zeros_like(p))
                    vh.copy_(torch.maximum(vh, v))
                    v = vh
                p -= alpha * m / (torch.sqrt(v) + eps)
            else:
                raise ValueError(cls)
        out.append([p.clone() for p in params])
    return out


def torch_optim_run(make_opt, params, grad_steps):
    ps = [p.clone().requires_grad_(True) for p in params]
    opt = make_opt(ps)
    out = []
    for grads in grad_steps:
        for p, g in zip(ps, grads):
            p.grad = g.clone()
        opt.step()
        out.append([p.detach().clone() for p in ps])
    return out


def assert_close(a_steps, b_steps, what, tol=2e-5):
    for a, b in zip(a_steps, b_steps):
        for x, y in zip(a, b):
            err = ((x - y).abs() / (y.abs() + 1e-3)).max().item()
            assert err < tol, "%s: reference and torch.optim differ (%g)" % (what, err)


def cross_check_against_torch(params, grad_steps):
    """Where Keras's and torch's rules coincide (epsilon 0, constant lr), the
    reference loops must equal torch.optim."""
    O = torch.optim
    checks = [
        ("Adam", {"learning_rate": 0.01, "epsilon": 0.0}, lambda ps: O.Adam(ps, lr=0.01, eps=0.0)),
        ("Adam", {"learning_rate": 0.01, "epsilon": 0.0, "amsgrad": True},
         lambda ps: O.Adam(ps, lr=0.01, eps=0.0, amsgrad=True)),
        ("AdamW", {"learning_rate": 0.01, "epsilon": 0.0, "weight_decay": 0.1},
         lambda ps: O.AdamW(ps, lr=0.01, eps=0.0, weight_decay=0.1)),
        ("RMSprop", {"learning_rate": 0.01, "epsilon": 0.0}, lambda ps: O.RMSprop(ps, lr=0.01, alpha=0.9, eps=0.0)),
        ("RMSprop", {"learning_rate": 0.01, "epsilon": 0.0, "centered": True, "momentum": 0.5},
         lambda ps: O.RMSprop(ps, lr=0.01, alpha=0.9, eps=0.0, centered=True, momentum=0.5)),
        ("SGD", {"learning_rate": 0.05, "momentum": 0.9, "nesterov": True},
         lambda ps: O.SGD(ps, lr=0.05, momentum=0.9, nesterov=True)),
    ]
    for cls, cfg, make in checks:
        ref = keras_reference(cls, cfg, None, params, grad_steps)
        tor = torch_optim_run(make, params, grad_steps)
        assert_close(ref, tor, "%s %s" % (cls, cfg))


def optimizer_cases():
    params = [randn(3, 4), randn(4)]
    names = ["dense/kernel", "dense/bias"]
    steps = 6
    grad_steps = [[randn(3, 4, scale=1.5), randn(4, scale=1.5)] for _ in range(steps)]
    cross_check_against_torch(params, grad_steps)
    O = torch.optim
    specs = [
        # (name, class, config, schedule, torch.optim factory where it matches Keras)
        ("sgd", "SGD", {"learning_rate": 0.1}, None, lambda ps: O.SGD(ps, lr=0.1)),
        ("sgd_momentum", "SGD", {"learning_rate": 0.05, "momentum": 0.9}, None,
         lambda ps: O.SGD(ps, lr=0.05, momentum=0.9)),
        ("sgd_nesterov", "SGD", {"learning_rate": 0.05, "momentum": 0.9, "nesterov": True}, None,
         lambda ps: O.SGD(ps, lr=0.05, momentum=0.9, nesterov=True)),
        ("sgd_momentum_expdecay_wd_clipvalue", "SGD",
         {"momentum": 0.8, "weight_decay": 0.05, "clipvalue": 0.5}, ExponentialDecay(0.1, 2, 0.5, staircase=True),
         None),
        ("sgd_wd_global_clipnorm", "SGD", {"learning_rate": 0.1, "weight_decay": 0.1, "global_clipnorm": 1.0}, None,
         None),
        ("rmsprop", "RMSprop", {"learning_rate": 0.01}, None, None),
        ("rmsprop_centered_momentum_clipnorm", "RMSprop",
         {"learning_rate": 0.01, "rho": 0.8, "momentum": 0.5, "centered": True, "clipnorm": 1.0}, None, None),
        ("adam", "Adam", {"learning_rate": 0.01}, None, None),
        ("adam_amsgrad_global_clipnorm", "Adam",
         {"learning_rate": 0.02, "amsgrad": True, "global_clipnorm": 1.5, "beta_2": 0.99}, None, None),
        ("adam_piecewise_clipnorm", "Adam", {"clipnorm": 0.5, "epsilon": 1e-3},
         PiecewiseConstantDecay([1, 3], [0.1, 0.05, 0.01]), None),
        ("adamw", "AdamW", {"learning_rate": 0.01}, None, None),
        ("adamw_cosine_warmup", "AdamW", {"weight_decay": 0.1},
         CosineDecay(0.0, 3, alpha=0.1, warmup_target=0.05, warmup_steps=2), None),
    ]
    cases = []
    for name, cls, cfg, sched, torch_factory in specs:
        if torch_factory is not None:
            expected = torch_optim_run(torch_factory, params, grad_steps)
            assert_close(keras_reference(cls, cfg, None, params, grad_steps), expected, name)
            source = "torch.optim"
        else:
            expected = keras_reference(cls, cfg, sched, params, grad_steps)
            source = "reference loop"
        config = dict(cfg)
        if sched is not None:
            config["learning_rate"] = sched.to_json()
        cases.append({
            "name": name,
            "source": source,
            "optimizer": {"class_name": cls, "config": config},
            "variables": names,
            "initial": [T(p) for p in params],
            "grads": [[T(g) for g in gs] for gs in grad_steps],
            "expected": [[T(p) for p in ps] for ps in expected],
            "learning_rates": [lr_at(cfg, sched, it) for it in range(steps)],
        })
    return cases


# ----------------------------------------------------------------------------
# Layers: Conv2DTranspose, DepthwiseConv2D, SeparableConv2D, UpSampling2D,
# Resizing, ZeroPadding2D, Cropping2D, Permute, ReLU, LeakyReLU, PReLU,
# Softmax, GroupNormalization and the affine sampler of the Random* image
# layers (kiln/layers/testdata/new_layers_golden.json). Own generator, so the
# other sections' data do not move when cases are added here.
# ----------------------------------------------------------------------------

LGEN = torch.Generator().manual_seed(20261125)


def lrandn(*shape):
    return torch.randn(*shape, generator=LGEN).float()


def tf_same_pads(n, k, s, d=1):
    """TensorFlow's "same" padding (before, after) along one axis."""
    span = d * (k - 1) + 1
    out = -(-n // s)
    total = max((out - 1) * s + span - n, 0)
    return total // 2, total - total // 2


def conv2d_tf(x_cl, kernel_cl, strides, padding, dilation=(1, 1), groups=1):
    """Keras Conv2D on channels_last input with a Keras-layout kernel
    (kh, kw, in/groups, out), by F.conv2d after TensorFlow's padding."""
    x = x_cl.permute(0, 3, 1, 2)
    w = kernel_cl.permute(3, 2, 0, 1)
    if padding == "same":
        ph = tf_same_pads(x.shape[2], w.shape[2], strides[0], dilation[0])
        pw = tf_same_pads(x.shape[3], w.shape[3], strides[1], dilation[1])
        x = F.pad(x, (pw[0], pw[1], ph[0], ph[1]))
    y = F.conv2d(x, w, stride=strides, dilation=dilation, groups=groups)
    return y.permute(0, 2, 3, 1)


def deconv_length(n, k, s, padding, output_padding, d):
    k = k + (k - 1) * (d - 1)
    if output_padding is None:
        return n * s + max(k - s, 0) if padding == "valid" else n * s
    pad = k // 2 if padding == "same" else 0
    return (n - 1) * s + k - 2 * pad + output_padding


def conv2d_transpose_tf(x_cl, kernel, strides, padding, output_padding, dilation):
    """TensorFlow's conv2d_transpose as the adjoint of its conv2d: the gradient
    of conv2d (TensorFlow padding) with respect to an input of the output's
    size, taken by autograd. kernel: Keras layout (kh, kw, filters, in)."""
    n, h, w, _ = x_cl.shape
    kh, kw, filters, _ = kernel.shape
    op = output_padding or (None, None)
    oh = deconv_length(h, kh, strides[0], padding, op[0], dilation[0])
    ow = deconv_length(w, kw, strides[1], padding, op[1], dilation[1])
    z = torch.zeros(n, oh, ow, filters, dtype=torch.float64, requires_grad=True)
    # Forward conv maps `filters` channels to `in` channels: kernel (kh, kw, filters, in).
    y = conv2d_tf(z, kernel.double(), strides, padding, dilation)
    assert tuple(y.shape) == tuple(x_cl.shape), (y.shape, x_cl.shape)
    (g,) = torch.autograd.grad(y, z, grad_outputs=x_cl.double())
    return g.float()


def grid_sample_affine(images_cl, transforms, interpolation, fill_mode):
    """Keras's affine_transform through F.grid_sample (align_corners=False:
    pixel centres at (2i+1)/size - 1; "reflection" padding reflects about the
    image edge, Keras's "reflect"; "border" is "nearest"; "zeros" is
    "constant" with fill 0)."""
    n, h, w, c = images_cl.shape
    ys, xs = torch.meshgrid(torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64),
                            indexing="ij")
    t = transforms.double()
    sx = t[:, 0, None, None] * xs + t[:, 1, None, None] * ys + t[:, 2, None, None]
    sy = t[:, 3, None, None] * xs + t[:, 4, None, None] * ys + t[:, 5, None, None]
    grid = torch.stack([(2 * sx + 1) / w - 1, (2 * sy + 1) / h - 1], dim=-1)
    pad = {"reflect": "reflection", "nearest": "border", "constant": "zeros"}[fill_mode]
    out = F.grid_sample(images_cl.permute(0, 3, 1, 2).double(), grid, mode=interpolation, padding_mode=pad,
                        align_corners=False)
    return out.permute(0, 2, 3, 1).float()


def rotation_transforms(n, h, w, factor):
    a = torch.full((n,), factor * 2 * math.pi, dtype=torch.float64)
    c, s = torch.cos(a), torch.sin(a)
    xo = ((w - 1) - (c * (w - 1) - s * (h - 1))) / 2
    yo = ((h - 1) - (s * (w - 1) + c * (h - 1))) / 2
    return torch.stack([c, -s, xo, s, c, yo], 1)


def zoom_transforms(n, h, w, zy, zx):
    zy = torch.full((n,), zy, dtype=torch.float64)
    zx = torch.full((n,), zx, dtype=torch.float64)
    z = torch.zeros(n, dtype=torch.float64)
    return torch.stack([zx, z, (w - 1) / 2 * (1 - zx), z, zy, (h - 1) / 2 * (1 - zy)], 1)


def translation_transforms(n, h, w, fy, fx):
    o, z = torch.ones(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    return torch.stack([o, z, torch.full((n,), -fx * w), z, o, torch.full((n,), -fy * h)], 1).double()


def layer_cases():
    cases = []

    def add(name, cls, config, x, expected, weights=(), training=False, rtol=1e-5, atol=1e-5, source=""):
        cases.append({"name": name, "class_name": cls, "config": config, "input": T(x),
                      "weights": [T(wt) for wt in weights], "training": training, "expected": T(expected),
                      "rtol": rtol, "atol": atol, "source": source})

    # --- Conv2DTranspose: TensorFlow's conv2d_transpose (autograd adjoint of conv2d) ---
    for name, cfg, shape in [
        ("valid_s2_k3", {"kernel_size": 3, "strides": 2}, (2, 4, 5, 3)),
        ("same_s2_k3", {"kernel_size": 3, "strides": 2, "padding": "same"}, (2, 4, 5, 3)),
        ("same_s2_k4", {"kernel_size": 4, "strides": 2, "padding": "same"}, (2, 3, 3, 2)),
        ("same_s1_k3", {"kernel_size": [3, 2], "padding": "same"}, (1, 4, 4, 2)),
        ("valid_s3_k2", {"kernel_size": 2, "strides": 3}, (1, 3, 2, 2)),
        ("same_s2_op0", {"kernel_size": 3, "strides": 2, "padding": "same", "output_padding": 0}, (1, 3, 4, 2)),
        ("valid_op1", {"kernel_size": 3, "strides": [2, 3], "output_padding": [1, 2]}, (1, 3, 4, 2)),
        ("same_dilated", {"kernel_size": 3, "padding": "same", "dilation_rate": [1, 2]}, (1, 4, 5, 2)),
        ("valid_dilated", {"kernel_size": [2, 3], "dilation_rate": 2}, (1, 3, 4, 2)),
    ]:
        filters = 3
        ks = cfg["kernel_size"] if isinstance(cfg["kernel_size"], list) else [cfg["kernel_size"]] * 2
        st = cfg.get("strides", 1)
        st = st if isinstance(st, list) else [st, st]
        dl = cfg.get("dilation_rate", 1)
        dl = dl if isinstance(dl, list) else [dl, dl]
        op = cfg.get("output_padding")
        op = None if op is None else (op if isinstance(op, list) else [op, op])
        x = lrandn(*shape)
        kernel = lrandn(ks[0], ks[1], filters, shape[-1]) * 0.5
        bias = lrandn(filters)
        y = conv2d_transpose_tf(x, kernel, st, cfg.get("padding", "valid"), op, dl) + bias
        add("Conv2DTranspose_" + name, "Conv2DTranspose", dict(cfg, filters=filters), x, y, [kernel, bias],
            source="autograd adjoint of F.conv2d with TensorFlow padding")
    # channels_first: same values, transposed layout.
    x = lrandn(2, 3, 4, 4)
    kernel = lrandn(3, 3, 2, 3) * 0.5
    y = conv2d_transpose_tf(x.permute(0, 2, 3, 1), kernel, [2, 2], "same", None, [1, 1]).permute(0, 3, 1, 2)
    add("Conv2DTranspose_channels_first_nobias", "Conv2DTranspose",
        {"filters": 2, "kernel_size": 3, "strides": 2, "padding": "same", "use_bias": False,
         "data_format": "channels_first"}, x, y, [kernel], source="autograd adjoint of F.conv2d")
    # Where PyTorch's conv_transpose2d(padding, output_padding) crops the same window
    # (even kernel), compare with it directly.
    x = lrandn(2, 3, 4, 2)
    kernel = lrandn(4, 4, 3, 2) * 0.5
    y = F.conv_transpose2d(x.permute(0, 3, 1, 2), kernel.permute(3, 2, 0, 1), stride=2, padding=1).permute(0, 2, 3, 1)
    add("Conv2DTranspose_same_k4_vs_conv_transpose2d", "Conv2DTranspose",
        {"filters": 3, "kernel_size": 4, "strides": 2, "padding": "same", "use_bias": False}, x, y, [kernel],
        source="F.conv_transpose2d(stride=2, padding=1)")

    # --- DepthwiseConv2D (conv2d with groups=in_channels) and SeparableConv2D ---
    for name, cfg, shape in [
        ("valid", {"kernel_size": 3}, (2, 5, 5, 3)),
        ("same_s2_dm2", {"kernel_size": 3, "strides": 2, "padding": "same", "depth_multiplier": 2}, (2, 5, 6, 3)),
        ("dilated", {"kernel_size": [2, 3], "dilation_rate": 2, "padding": "same"}, (1, 6, 6, 2)),
    ]:
        dm = cfg.get("depth_multiplier", 1)
        ks = cfg["kernel_size"] if isinstance(cfg["kernel_size"], list) else [cfg["kernel_size"]] * 2
        st = [cfg.get("strides", 1)] * 2
        dl = [cfg.get("dilation_rate", 1)] * 2
        c = shape[-1]
        x = lrandn(*shape)
        dw = lrandn(ks[0], ks[1], c, dm) * 0.5
        bias = lrandn(c * dm)
        # Grouped kernel (kh, kw, 1, c*dm): output channel c*dm + m.
        y = conv2d_tf(x, dw.reshape(ks[0], ks[1], 1, c * dm), st, cfg.get("padding", "valid"), dl, groups=c) + bias
        add("DepthwiseConv2D_" + name, "DepthwiseConv2D", cfg, x, y, [dw, bias],
            source="F.conv2d(groups=in_channels)")
        filters = 4
        pw = lrandn(1, 1, c * dm, filters) * 0.5
        b2 = lrandn(filters)
        mid = conv2d_tf(x, dw.reshape(ks[0], ks[1], 1, c * dm), st, cfg.get("padding", "valid"), dl, groups=c)
        y2 = conv2d_tf(mid, pw, [1, 1], "valid") + b2
        add("SeparableConv2D_" + name, "SeparableConv2D", dict(cfg, filters=filters), x, y2, [dw, pw, b2],
            source="F.conv2d(groups=in) then 1x1 F.conv2d")

    # --- resampling ---
    x = lrandn(2, 3, 4, 2)
    cf = x.permute(0, 3, 1, 2)
    add("UpSampling2D_nearest", "UpSampling2D", {"size": [2, 3]}, x,
        F.interpolate(cf, scale_factor=(2, 3), mode="nearest").permute(0, 2, 3, 1), source="F.interpolate nearest")
    add("UpSampling2D_bilinear", "UpSampling2D", {"size": [2, 3], "interpolation": "bilinear"}, x,
        F.interpolate(cf, size=(6, 12), mode="bilinear", align_corners=False).permute(0, 2, 3, 1),
        source="F.interpolate bilinear align_corners=False")
    add("UpSampling2D_bilinear_channels_first", "UpSampling2D",
        {"size": 2, "interpolation": "bilinear", "data_format": "channels_first"}, cf,
        F.interpolate(cf, size=(6, 8), mode="bilinear", align_corners=False),
        source="F.interpolate bilinear align_corners=False")
    img = lrandn(2, 7, 9, 3)
    icf = img.permute(0, 3, 1, 2)
    for (hh, ww) in [(4, 5), (10, 13), (7, 4)]:
        add("Resizing_bilinear_%dx%d" % (hh, ww), "Resizing", {"height": hh, "width": ww}, img,
            F.interpolate(icf, size=(hh, ww), mode="bilinear", align_corners=False).permute(0, 2, 3, 1),
            source="F.interpolate bilinear align_corners=False")
        add("Resizing_nearest_%dx%d" % (hh, ww), "Resizing",
            {"height": hh, "width": ww, "interpolation": "nearest"}, img,
            F.interpolate(icf, size=(hh, ww), mode="nearest-exact").permute(0, 2, 3, 1),
            source="F.interpolate nearest-exact")
    # crop_to_aspect_ratio 4x4 from 7x9: centred 7x7 window (columns 1..7).
    add("Resizing_crop_to_aspect_ratio", "Resizing", {"height": 4, "width": 4, "crop_to_aspect_ratio": True}, img,
        F.interpolate(icf[:, :, :, 1:8], size=(4, 4), mode="bilinear", align_corners=False).permute(0, 2, 3, 1),
        source="centre crop then F.interpolate")
    # pad_to_aspect_ratio 6x6 from 7x9: padded to 9x9 (one row above, one below).
    padded = F.pad(icf, (0, 0, 1, 1), value=0.5)
    add("Resizing_pad_to_aspect_ratio", "Resizing",
        {"height": 6, "width": 6, "pad_to_aspect_ratio": True, "fill_value": 0.5}, img,
        F.interpolate(padded, size=(6, 6), mode="bilinear", align_corners=False).permute(0, 2, 3, 1),
        source="F.pad then F.interpolate")

    # --- padding, cropping, permute ---
    x = lrandn(2, 3, 4, 2)
    add("ZeroPadding2D_default", "ZeroPadding2D", {}, x, F.pad(x, (0, 0, 1, 1, 1, 1)), source="F.pad")
    add("ZeroPadding2D_asymmetric", "ZeroPadding2D", {"padding": [[1, 2], [0, 3]]}, x,
        F.pad(x, (0, 0, 0, 3, 1, 2)), source="F.pad")
    add("ZeroPadding2D_channels_first", "ZeroPadding2D", {"padding": [2, 1], "data_format": "channels_first"},
        x, F.pad(x, (1, 1, 2, 2)), source="F.pad")
    y = lrandn(2, 6, 7, 2)
    add("Cropping2D", "Cropping2D", {"cropping": [[1, 2], [2, 1]]}, y, y[:, 1:4, 2:6, :], source="slicing")
    yc = lrandn(2, 2, 6, 7)
    add("Cropping2D_channels_first", "Cropping2D", {"cropping": [1, 2], "data_format": "channels_first"}, yc,
        yc[:, :, 1:5, 2:5], source="slicing")
    z = lrandn(2, 3, 4, 5)
    add("Permute_312", "Permute", {"dims": [3, 1, 2]}, z, z.permute(0, 3, 1, 2), source="torch.permute")

    # --- activations ---
    a = lrandn(3, 4, 5) * 3
    add("LeakyReLU_default", "LeakyReLU", {}, a, F.leaky_relu(a, 0.3), source="F.leaky_relu(0.3)")
    add("LeakyReLU_0.1", "LeakyReLU", {"negative_slope": 0.1}, a, F.leaky_relu(a, 0.1), source="F.leaky_relu")
    add("ReLU_default", "ReLU", {}, a, F.relu(a), source="F.relu")
    add("ReLU_max6", "ReLU", {"max_value": 6.0}, a, F.relu6(a), source="F.relu6")

    def keras_relu_doc(x, max_value, slope, thr):
        # Keras's documented piecewise definition.
        y = torch.where(x > thr, x, slope * (x - thr))
        return y if max_value is None else torch.where(x >= max_value, torch.full_like(x, max_value), y)

    add("ReLU_all", "ReLU", {"max_value": 2.5, "negative_slope": 0.2, "threshold": 0.5}, a,
        keras_relu_doc(a, 2.5, 0.2, 0.5), source="Keras's documented formula")
    add("ReLU_slope", "ReLU", {"negative_slope": 0.25}, a, F.leaky_relu(a, 0.25), source="F.leaky_relu")
    add("ReLU_threshold", "ReLU", {"threshold": 1.0}, a, keras_relu_doc(a, None, 0.0, 1.0),
        source="Keras's documented formula")
    img = lrandn(2, 3, 4, 5)
    alpha = lrandn(5) * 0.3
    add("PReLU_shared_axes_12", "PReLU", {"shared_axes": [1, 2]}, img,
        F.prelu(img.permute(0, 3, 1, 2), alpha).permute(0, 2, 3, 1), [alpha.reshape(1, 1, 5)],
        source="F.prelu (one slope per channel)")
    alpha_full = lrandn(3, 4, 5) * 0.3
    add("PReLU_full", "PReLU", {}, img, torch.where(img >= 0, img, alpha_full * img), [alpha_full],
        source="prelu formula, elementwise alpha")
    add("Softmax_last", "Softmax", {}, a, F.softmax(a, -1), source="F.softmax")
    add("Softmax_axis1", "Softmax", {"axis": 1}, a, F.softmax(a, 1), source="F.softmax")
    add("Softmax_axes", "Softmax", {"axis": [1, 2]}, a,
        F.softmax(a.reshape(3, 20), -1).reshape(3, 4, 5), source="F.softmax over the flattened axes")

    # --- GroupNormalization ---
    g = lrandn(2, 4, 3, 6) * 2 + 1
    gamma, beta = lrandn(6), lrandn(6)
    add("GroupNormalization_3groups", "GroupNormalization", {"groups": 3}, g,
        F.group_norm(g.permute(0, 3, 1, 2), 3, gamma, beta, 1e-3).permute(0, 2, 3, 1), [gamma, beta],
        source="F.group_norm")
    add("GroupNormalization_instance_eps", "GroupNormalization", {"groups": -1, "epsilon": 1e-5}, g,
        F.group_norm(g.permute(0, 3, 1, 2), 6, gamma, beta, 1e-5).permute(0, 2, 3, 1), [gamma, beta],
        source="F.group_norm")
    seq = lrandn(3, 5, 4)
    add("GroupNormalization_axis1_noscale", "GroupNormalization", {"groups": 1, "axis": 1, "scale": False},
        seq, F.group_norm(seq, 1, None, beta[:5], 1e-3), [beta[:5]], source="F.group_norm")

    # --- the Random* layers with a fixed draw (lower == upper), in training ---
    img = lrandn(2, 6, 7, 2)
    n, h, w = 2, 6, 7
    for fill in ["reflect", "constant", "nearest"]:
        for interp in ["bilinear", "nearest"]:
            extra = {"fill_mode": fill, "interpolation": interp, "seed": 3}
            add("RandomRotation_%s_%s" % (fill, interp), "RandomRotation", dict(extra, factor=[0.07, 0.07]), img,
                grid_sample_affine(img, rotation_transforms(n, h, w, 0.07), interp, fill), training=True,
                atol=2e-5, source="F.grid_sample(align_corners=False)")
        add("RandomZoom_in_%s" % fill, "RandomZoom", {"height_factor": [-0.3, -0.3], "width_factor": [0.2, 0.2],
                                                     "fill_mode": fill}, img,
            grid_sample_affine(img, zoom_transforms(n, h, w, 0.7, 1.2), "bilinear", fill), training=True,
            atol=2e-5, source="F.grid_sample(align_corners=False)")
        add("RandomTranslation_%s" % fill, "RandomTranslation",
            {"height_factor": [0.25, 0.25], "width_factor": [-0.3, -0.3], "fill_mode": fill}, img,
            grid_sample_affine(img, translation_transforms(n, h, w, 0.25, -0.3), "bilinear", fill), training=True,
            atol=2e-5, source="F.grid_sample(align_corners=False)")
    add("RandomZoom_out_same_aspect", "RandomZoom", {"height_factor": [0.5, 0.5]}, img,
        grid_sample_affine(img, zoom_transforms(n, h, w, 1.5, 1.5), "bilinear", "reflect"), training=True,
        atol=2e-5, source="F.grid_sample(align_corners=False)")
    return cases


# ----------------------------------------------------------------------------
# Keras 3 parity additions (issue #10): Adagrad, Adadelta, Adamax, Nadam, Lion,
# Ftrl. Own generator and own files, so the data above stays as it is.
# References are small numpy (float64) loops written from Keras 3's documented
# formulas; torch.optim gives the expected values where its rule equals
# Keras's (Adadelta as is, NAdam with momentum_decay=1, Adagrad and Adamax
# with epsilon 0, where their epsilon placement stops mattering), and every
# numpy loop is checked against torch.optim in that configuration. NAdam runs
# with foreach=True: torch 1.13's single-tensor NAdam multiplies mu_t twice
# into the next momentum product (fixed in later releases); the foreach path
# follows the documented formula, as Keras does.
# ----------------------------------------------------------------------------

GEN3 = torch.Generator().manual_seed(20261125)


def randn3(*shape, scale=1.0):
    return (torch.randn(*shape, generator=GEN3) * scale).float()


def rand3(*shape):
    return torch.rand(*shape, generator=GEN3).float()


def np_clip(grads, cfg):
    if cfg.get("clipnorm"):
        cn = cfg["clipnorm"]
        return [g * cn / max(np.sqrt((g * g).sum()), cn) for g in grads]
    if cfg.get("global_clipnorm"):
        cn = cfg["global_clipnorm"]
        norm = np.sqrt(sum((g * g).sum() for g in grads))
        return [g * (cn * min(1.0 / norm, 1.0 / cn)) for g in grads]
    if cfg.get("clipvalue"):
        return [np.clip(g, -cfg["clipvalue"], cfg["clipvalue"]) for g in grads]
    return grads


def np_keras_optimizer(cls, cfg, sched, params, grad_steps):
    """Keras 3's apply() with the update rules from its documentation."""
    params = [p.double().numpy().copy() for p in params]
    state = [dict() for _ in params]
    out = []
    u_product = 1.0
    for it, grads in enumerate(grad_steps):
        grads = np_clip([g.double().numpy().copy() for g in grads], cfg)
        lr = sched(it) if sched is not None else cfg.get("learning_rate", 0.001)
        if cfg.get("weight_decay"):
            params = [p - p * cfg["weight_decay"] * lr for p in params]
        t = it + 1
        if cls == "Nadam":
            b1 = cfg.get("beta_1", 0.9)
            u_t = b1 * (1 - 0.5 * 0.96 ** t)
            u_next = b1 * (1 - 0.5 * 0.96 ** (t + 1))
            u_product *= u_t
        for i, g in enumerate(grads):
            p, s = params[i], state[i]
            if cls == "Adagrad":
                acc = s.setdefault("acc", np.full_like(p, cfg.get("initial_accumulator_value", 0.1))) + g * g
                s["acc"] = acc
                p = p - lr * g / np.sqrt(acc + cfg.get("epsilon", 1e-7))
            elif cls == "Adadelta":
                rho, eps = cfg.get("rho", 0.95), cfg.get("epsilon", 1e-7)
                ag = rho * s.get("ag", 0.0) + (1 - rho) * g * g
                ad = s.get("ad", np.zeros_like(p))
                delta = -np.sqrt(ad + eps) * g / np.sqrt(ag + eps)
                s["ag"], s["ad"] = ag, rho * ad + (1 - rho) * delta * delta
                p = p + lr * delta
            elif cls == "Adamax":
                b1, b2, eps = cfg.get("beta_1", 0.9), cfg.get("beta_2", 0.999), cfg.get("epsilon", 1e-7)
                m = s.get("m", 0.0) * b1 + (1 - b1) * g
                u = np.maximum(b2 * s.get("u", np.zeros_like(p)), np.abs(g))
                s["m"], s["u"] = m, u
                p = p - (lr / (1 - b1 ** t)) * m / (u + eps)
            elif cls == "Nadam":
                b2, eps = cfg.get("beta_2", 0.999), cfg.get("epsilon", 1e-7)
                m = s.get("m", 0.0) * b1 + (1 - b1) * g
                v = s.get("v", 0.0) * b2 + (1 - b2) * g * g
                s["m"], s["v"] = m, v
                m_hat = u_next * m / (1 - u_product * u_next) + (1 - u_t) * g / (1 - u_product)
                v_hat = v / (1 - b2 ** t)
                p = p - lr * m_hat / (np.sqrt(v_hat) + eps)
            elif cls == "Lion":
                b1, b2 = cfg.get("beta_1", 0.9), cfg.get("beta_2", 0.99)
                m = s.get("m", np.zeros_like(p))
                p = p - lr * np.sign(b1 * m + (1 - b1) * g)
                s["m"] = b2 * m + (1 - b2) * g
            elif cls == "Ftrl":
                # The paper's form (McMahan et al. 2013, as Keras documents it):
                # w = 0 where |z| <= l1, else (sign(z) l1 - z) / ((beta + n^p) / lr + 2 l2).
                pw = -cfg.get("learning_rate_power", -0.5)
                l1 = cfg.get("l1_regularization_strength", 0.0)
                l2 = cfg.get("l2_regularization_strength", 0.0)
                shrink = cfg.get("l2_shrinkage_regularization_strength", 0.0)
                beta = cfg.get("beta", 0.0)
                n = s.get("n", np.full_like(p, cfg.get("initial_accumulator_value", 0.1)))
                z = s.get("z", np.zeros_like(p))
                n_new = n + g * g
                sigma = (n_new ** pw - n ** pw) / lr
                z = z + (g + 2 * shrink * p) - sigma * p
                denom = (beta + n_new ** pw) / lr + 2 * l2
                p = np.where(np.abs(z) <= l1, 0.0, (np.sign(z) * l1 - z) / denom)
                s["n"], s["z"] = n_new, z
            else:
                raise ValueError(cls)
            params[i] = p
        out.append([torch.from_numpy(p.copy()).float() for p in params])
    return out


class PolynomialDecay:
    def __init__(self, initial_learning_rate, decay_steps, end_learning_rate=0.0001, power=1.0, cycle=False):
        self.cfg = dict(initial_learning_rate=initial_learning_rate, decay_steps=decay_steps,
                        end_learning_rate=end_learning_rate, power=power, cycle=cycle)

    def __call__(self, step):
        c = self.cfg
        d = c["decay_steps"]
        if c["cycle"]:
            d = d * (1 if step == 0 else math.ceil(step / d))
        else:
            step = min(step, d)
        return (c["initial_learning_rate"] - c["end_learning_rate"]) * (1 - step / d) ** c["power"] + \
            c["end_learning_rate"]

    def to_json(self):
        return {"class_name": "PolynomialDecay", "config": self.cfg}


class InverseTimeDecay:
    def __init__(self, initial_learning_rate, decay_steps, decay_rate, staircase=False):
        self.cfg = dict(initial_learning_rate=initial_learning_rate, decay_steps=decay_steps, decay_rate=decay_rate,
                        staircase=staircase)

    def __call__(self, step):
        c = self.cfg
        p = step / c["decay_steps"]
        if c["staircase"]:
            p = math.floor(p)
        return c["initial_learning_rate"] / (1 + c["decay_rate"] * p)

    def to_json(self):
        return {"class_name": "InverseTimeDecay", "config": self.cfg}


class CosineDecayRestarts:
    """SGDR by walking the periods one by one (period i: first_decay_steps *
    t_mul^i steps, peak m_mul^i), an independent route to Keras's closed form."""

    def __init__(self, initial_learning_rate, first_decay_steps, t_mul=2.0, m_mul=1.0, alpha=0.0):
        self.cfg = dict(initial_learning_rate=initial_learning_rate, first_decay_steps=first_decay_steps,
                        t_mul=t_mul, m_mul=m_mul, alpha=alpha)

    def __call__(self, step):
        c = self.cfg
        start, length, peak = 0.0, float(c["first_decay_steps"]), 1.0
        while step >= start + length - 1e-9:
            start += length
            length *= c["t_mul"]
            peak *= c["m_mul"]
        frac = (step - start) / length
        cosine = 0.5 * peak * (1 + math.cos(math.pi * frac))
        return c["initial_learning_rate"] * ((1 - c["alpha"]) * cosine + c["alpha"])

    def to_json(self):
        return {"class_name": "CosineDecayRestarts", "config": self.cfg}


def keras3_schedule_cases():
    scheds = [
        PolynomialDecay(0.1, 10),
        PolynomialDecay(0.1, 4, end_learning_rate=0.01, power=0.5),
        PolynomialDecay(0.1, 4, end_learning_rate=0.01, power=2.0, cycle=True),
        InverseTimeDecay(0.1, 2, 0.5),
        InverseTimeDecay(0.1, 3, 1.5, staircase=True),
        InverseTimeDecay(0.2, 0.5, 0.1),
        CosineDecayRestarts(0.1, 3),
        CosineDecayRestarts(0.1, 2, t_mul=1.0, m_mul=0.5, alpha=0.1),
        CosineDecayRestarts(0.2, 2, t_mul=1.5, m_mul=0.8, alpha=0.05),
    ]
    steps = list(range(0, 25))
    return [{"schedule": s.to_json(), "steps": steps, "values": [s(t) for t in steps]} for s in scheds]


def keras3_optimizer_cases():
    params = [randn3(3, 4), randn3(4)]
    names = ["dense/kernel", "dense/bias"]
    steps = 6
    grad_steps = [[randn3(3, 4, scale=1.5), randn3(4, scale=1.5)] for _ in range(steps)]
    O = torch.optim
    # Each numpy loop against torch.optim where the two rules coincide.
    checks = [
        ("Adagrad", {"learning_rate": 0.1, "epsilon": 0.0},
         lambda ps: O.Adagrad(ps, lr=0.1, initial_accumulator_value=0.1, eps=0.0)),
        ("Adadelta", {"learning_rate": 1.0}, lambda ps: O.Adadelta(ps, lr=1.0, rho=0.95, eps=1e-7)),
        ("Adamax", {"learning_rate": 0.01, "epsilon": 0.0}, lambda ps: O.Adamax(ps, lr=0.01, eps=0.0)),
        ("Nadam", {"learning_rate": 0.01}, lambda ps: O.NAdam(ps, lr=0.01, eps=1e-7, momentum_decay=1.0, foreach=True)),
    ]
    for cls, cfg, make in checks:
        assert_close(np_keras_optimizer(cls, cfg, None, params, grad_steps),
                     torch_optim_run(make, params, grad_steps), "%s %s" % (cls, cfg))
    specs = [
        ("adagrad", "Adagrad", {"learning_rate": 0.1}, None, None),
        ("adagrad_eps0_torch", "Adagrad", {"learning_rate": 0.1, "epsilon": 0.0}, None,
         lambda ps: O.Adagrad(ps, lr=0.1, initial_accumulator_value=0.1, eps=0.0)),
        ("adagrad_init0_clipnorm_wd", "Adagrad",
         {"learning_rate": 0.05, "initial_accumulator_value": 0.0, "epsilon": 1e-3, "clipnorm": 1.0,
          "weight_decay": 0.1}, None, None),
        ("adadelta_torch", "Adadelta", {"learning_rate": 1.0}, None,
         lambda ps: O.Adadelta(ps, lr=1.0, rho=0.95, eps=1e-7)),
        ("adadelta_defaults", "Adadelta", {}, None, None),
        ("adadelta_rho_eps_torch", "Adadelta", {"learning_rate": 0.5, "rho": 0.8, "epsilon": 1e-4}, None,
         lambda ps: O.Adadelta(ps, lr=0.5, rho=0.8, eps=1e-4)),
        ("adamax", "Adamax", {"learning_rate": 0.01}, None, None),
        ("adamax_eps0_torch", "Adamax", {"learning_rate": 0.01, "epsilon": 0.0, "beta_2": 0.9}, None,
         lambda ps: O.Adamax(ps, lr=0.01, betas=(0.9, 0.9), eps=0.0)),
        ("adamax_expdecay_clipvalue", "Adamax", {"epsilon": 1e-2, "clipvalue": 1.0},
         ExponentialDecay(0.05, 2, 0.5), None),
        ("nadam_torch", "Nadam", {"learning_rate": 0.01}, None,
         lambda ps: O.NAdam(ps, lr=0.01, eps=1e-7, momentum_decay=1.0, foreach=True)),
        ("nadam_betas_torch", "Nadam", {"learning_rate": 0.02, "beta_1": 0.8, "beta_2": 0.99, "epsilon": 1e-3},
         None, lambda ps: O.NAdam(ps, lr=0.02, betas=(0.8, 0.99), eps=1e-3, momentum_decay=1.0, foreach=True)),
        ("nadam_global_clipnorm_wd", "Nadam", {"learning_rate": 0.01, "global_clipnorm": 1.0, "weight_decay": 0.05},
         None, None),
        ("lion", "Lion", {"learning_rate": 0.01}, None, None),
        ("lion_betas_wd_cosine", "Lion", {"beta_1": 0.5, "beta_2": 0.9, "weight_decay": 0.3},
         CosineDecay(0.02, 5, alpha=0.1), None),
        ("ftrl", "Ftrl", {"learning_rate": 0.1}, None, None),
        ("ftrl_l1_l2_beta", "Ftrl",
         {"learning_rate": 0.2, "l1_regularization_strength": 0.05, "l2_regularization_strength": 0.1,
          "beta": 0.5, "initial_accumulator_value": 0.2}, None, None),
        ("ftrl_shrinkage_power", "Ftrl",
         {"learning_rate": 0.1, "learning_rate_power": -0.7, "l2_shrinkage_regularization_strength": 0.2,
          "l1_regularization_strength": 0.5}, None, None),
        ("ftrl_power0", "Ftrl", {"learning_rate": 0.05, "learning_rate_power": 0.0}, None, None),
    ]
    cases = []
    for name, cls, cfg, sched, torch_factory in specs:
        ref = np_keras_optimizer(cls, cfg, sched, params, grad_steps)
        if torch_factory is not None:
            expected = torch_optim_run(torch_factory, params, grad_steps)
            assert_close(ref, expected, name)
            source = "torch.optim"
        else:
            expected = ref
            source = "numpy reference"
        config = dict(cfg)
        if sched is not None:
            config["learning_rate"] = sched.to_json()
        cases.append({
            "name": name,
            "source": source,
            "optimizer": {"class_name": cls, "config": config},
            "variables": names,
            "initial": [T(p) for p in params],
            "grads": [[T(g) for g in gs] for gs in grad_steps],
            "expected": [[T(p) for p in ps] for ps in expected],
            "learning_rates": [sched(it) if sched is not None else cfg.get("learning_rate", 0.001)
                               for it in range(steps)],
        })
    return cases


# Losses added for Keras 3 parity: torch.nn.functional where it has the op
# (kl_div, poisson_nll_loss(log_input=False), cosine_similarity, log(cosh) in
# float64), numpy formulas for the ones it lacks (hinge, squared hinge,
# binary focal crossentropy, the latter checked against F.binary_cross_entropy
# at gamma 0).
GEN_L = torch.Generator().manual_seed(20261126)


def keras3_loss_cases():
    cases = []

    def add(name, cls, config, y_true, y_pred, per_sample, sample_weight=None, source="torch"):
        reduction = config.get("reduction", "sum_over_batch_size")
        cases.append({
            "name": name,
            "source": source,
            "loss": {"class_name": cls, "config": config},
            "y_true": T(y_true),
            "y_pred": T(y_pred),
            "sample_weight": None if sample_weight is None else T(sample_weight),
            "per_sample": T(per_sample.float()),
            "expected": T(reduce(per_sample.float(), sample_weight, reduction)),
        })

    def rn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=GEN_L) * scale).float()

    def ru(*shape):
        return torch.rand(*shape, generator=GEN_L).float()

    n, c = 8, 5
    weights = ru(n) * 2

    # KL divergence: distributions, one y_true row with zeros (clipped to eps).
    t = torch.softmax(rn(n, c, scale=2.0), -1)
    t[0] = torch.tensor([0.5, 0.5, 0.0, 0.0, 0.0])
    pr = torch.softmax(rn(n, c, scale=2.0), -1)
    per = F.kl_div(pr.double().clamp(EPS, 1).log(), t.double().clamp(EPS, 1), reduction="none").sum(-1)
    add("kl_divergence", "KLDivergence", {}, t, pr, per)
    add("kl_divergence_weighted_sum", "KLDivergence", {"reduction": "sum"}, t, pr, per, sample_weight=weights)

    # Poisson: rates > 0, counts.
    rate = ru(n, 3) * 4 + 0.01
    counts = torch.poisson(ru(n, 3) * 3, generator=GEN_L).float()
    per = F.poisson_nll_loss(rate.double(), counts.double(), log_input=False, full=False, eps=EPS,
                             reduction="none").mean(-1)
    add("poisson", "Poisson", {}, counts, rate, per)
    add("poisson_weighted_mean_with_sample_weight", "Poisson", {"reduction": "mean_with_sample_weight"}, counts, rate,
        per, sample_weight=weights)

    # Log-cosh, including errors large enough that cosh overflows float32.
    yt = rn(n, 4)
    yp = yt + rn(n, 4, scale=2.0)
    yp[0, 0] = yt[0, 0] + 120.0
    per = torch.log(torch.cosh((yp - yt).double())).mean(-1)
    add("log_cosh", "LogCosh", {}, yt, yp, per)
    yv = rn(n)
    pv = rn(n, 1)
    add("log_cosh_n_vs_n1", "LogCosh", {}, yv, pv, torch.log(torch.cosh((pv - yv.unsqueeze(-1)).double())).mean(-1),
        sample_weight=weights)

    # Cosine similarity (negated), last axis and axis 1 of a rank-3 input.
    a, b = rn(n, 6), rn(n, 6)
    add("cosine_similarity", "CosineSimilarity", {}, a, b, -F.cosine_similarity(a.double(), b.double(), dim=-1))
    a3, b3 = rn(3, 4, 2), rn(3, 4, 2)
    add("cosine_similarity_axis1", "CosineSimilarity", {"axis": 1}, a3, b3,
        -F.cosine_similarity(a3.double(), b3.double(), dim=1))

    # Hinge / squared hinge: {0, 1} labels (mapped to {-1, 1}) and {-1, 1} labels.
    def hinge_np(t, p, squared):
        t = t.double().numpy()
        p = p.double().numpy()
        if np.all((t == 0) | (t == 1)):
            t = 2 * t - 1
        m = np.maximum(1 - t * p, 0)
        return torch.from_numpy((m * m if squared else m).mean(-1))

    y01 = torch.randint(0, 2, (n, 3), generator=GEN_L).float()
    ypm = y01 * 2 - 1
    ph = rn(n, 3, scale=1.5)
    for cls, key, sq in [("Hinge", "hinge", False), ("SquaredHinge", "squared_hinge", True)]:
        add(key + "_01_labels", cls, {}, y01, ph, hinge_np(y01, ph, sq), source="numpy")
        add(key + "_pm1_labels_weighted", cls, {}, ypm, ph, hinge_np(ypm, ph, sq), sample_weight=weights,
            source="numpy")
    # Labels that are neither all {0,1} nor converted: used as given.
    ymix = ypm.clone()
    ymix[0, 0] = 0.0
    add("hinge_unconverted_labels", "Hinge", {}, ymix, ph, hinge_np(ymix, ph, False), source="numpy")

    # Binary focal crossentropy.
    def focal_np(t, p, gamma=2.0, alpha=0.25, balance=False, logits=False, ls=0.0):
        t = t.double().numpy()
        p = p.double().numpy()
        if ls:
            t = t * (1 - ls) + 0.5 * ls
        if logits:
            p = 1 / (1 + np.exp(-p))
        q = np.clip(p, EPS, 1 - EPS)
        bce = -(t * np.log(q) + (1 - t) * np.log(1 - q))
        p_t = t * p + (1 - t) * (1 - p)
        out = (1 - p_t) ** gamma * bce
        if balance:
            out = (t * alpha + (1 - t) * (1 - alpha)) * out
        return torch.from_numpy(out.mean(-1))

    yb = torch.randint(0, 2, (n, 3), generator=GEN_L).float()
    pb = torch.sigmoid(rn(n, 3, scale=2.0))
    xb = rn(n, 3, scale=3.0)
    ref0 = focal_np(yb, pb, gamma=0.0)
    bce = F.binary_cross_entropy(pb.double().clamp(EPS, 1 - EPS), yb.double(), reduction="none").mean(-1)
    assert torch.allclose(ref0, bce, rtol=1e-9, atol=1e-12), "focal at gamma 0 must be BCE"
    add("binary_focal_crossentropy", "BinaryFocalCrossentropy", {}, yb, pb, focal_np(yb, pb), source="numpy")
    add("binary_focal_gamma0_is_bce", "BinaryFocalCrossentropy", {"gamma": 0.0}, yb, pb, bce)
    add("binary_focal_balanced_alpha_gamma", "BinaryFocalCrossentropy",
        {"apply_class_balancing": True, "alpha": 0.4, "gamma": 1.5}, yb, pb,
        focal_np(yb, pb, gamma=1.5, alpha=0.4, balance=True), sample_weight=weights, source="numpy")
    add("binary_focal_logits_smoothing", "BinaryFocalCrossentropy", {"from_logits": True, "label_smoothing": 0.1},
        yb, xb, focal_np(yb, xb, logits=True, ls=0.1), source="numpy")
    y1 = torch.randint(0, 2, (n,), generator=GEN_L).float()
    p1 = torch.sigmoid(rn(n, 1))
    add("binary_focal_n_vs_n1", "BinaryFocalCrossentropy", {}, y1, p1, focal_np(y1.unsqueeze(-1), p1),
        source="numpy")
    return cases


# Metrics added for Keras 3 parity: F1Score/FBetaScore, RootMeanSquaredError,
# MeanIoU and R2Score, accumulated over several batches, from numpy float64
# formulas (sklearn-free); R2 is checked against 1 - SSE/SST written with
# np.var for unweighted data, and MeanIoU against a per-class set count.


def keras3_metric_cases():
    cases = []
    rng = np.random.default_rng(20261127)

    def add(name, cls, config, batches, results):
        cases.append({
            "name": name,
            "metric": {"class_name": cls, "config": config},
            "batches": [{"y_true": T(torch.as_tensor(b[0])), "y_pred": T(torch.as_tensor(b[1])),
                         "sample_weight": None if b[2] is None else T(torch.as_tensor(b[2]))} for b in batches],
            "results": results,
        })

    f32 = lambda a: np.asarray(a, dtype=np.float32)
    eps = 1e-7

    # F-scores: (batch, classes) one-hot / multi-label targets and scores.
    def fbeta(batches, average, beta=1.0, threshold=None):
        state = None
        out = []
        for y, p, w in batches:
            y = y.astype(np.float64)
            p = p.astype(np.float64)
            if threshold is None:
                pred = ((p >= p.max(-1, keepdims=True)) & (np.abs(p) > 1e-9)).astype(np.float64)
            else:
                pred = (p > threshold).astype(np.float64)
            ww = np.ones((y.shape[0], 1)) if w is None else w.astype(np.float64)[:, None]
            axis = None if average == "micro" else 0
            parts = [((pred * y) * ww).sum(axis), ((pred * (1 - y)) * ww).sum(axis),
                     (((1 - pred) * y) * ww).sum(axis), (y * ww).sum(axis)]
            state = parts if state is None else [a + b for a, b in zip(state, parts)]
            tp, fp, fn, wt = state
            prec = tp / (tp + fp + eps)
            rec = tp / (tp + fn + eps)
            f = prec * rec / (beta * beta * prec + rec + eps) * (1 + beta * beta)
            if average == "weighted":
                out.append(float((f * wt / (wt.sum() + eps)).sum()))
            elif average is not None:
                out.append(float(np.mean(f)))
            else:
                out.append([float(v) for v in f])
        return out

    nb, n, c = 3, 12, 4
    onehot = []
    for i in range(nb):
        labels = rng.integers(0, c, n)
        y = np.eye(c)[labels]
        logits = rng.normal(size=(n, c)) + 1.5 * y
        p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
        onehot.append((f32(y), f32(p), f32(rng.uniform(0.2, 2.0, n)) if i != 1 else None))
    multilabel = [(f32(rng.integers(0, 2, (n, c))), f32(rng.uniform(size=(n, c))), None) for _ in range(nb)]
    for avg in [None, "micro", "macro", "weighted"]:
        key = "none" if avg is None else avg
        add("f1_" + key, "F1Score", {"average": avg}, onehot, fbeta(onehot, avg))
        add("f1_" + key + "_threshold0.4_multilabel", "F1Score", {"average": avg, "threshold": 0.4}, multilabel,
            fbeta(multilabel, avg, threshold=0.4))
    add("fbeta2_macro", "FBetaScore", {"average": "macro", "beta": 2.0}, onehot, fbeta(onehot, "macro", beta=2.0))
    add("fbeta0.5_weighted_threshold", "FBetaScore", {"average": "weighted", "beta": 0.5, "threshold": 0.3},
        multilabel, fbeta(multilabel, "weighted", beta=0.5, threshold=0.3))

    # RMSE.
    def rmse(batches):
        tot, cnt, out = 0.0, 0.0, []
        for y, p, w in batches:
            y64, p64 = y.astype(np.float64), p.astype(np.float64)
            if y64.ndim == 1 and p64.ndim == 2:
                y64 = y64[:, None]
            e = ((p64 - y64) ** 2).reshape(len(y64), -1).mean(-1)
            ww = np.ones(len(e)) if w is None else w.astype(np.float64)
            tot += (e * ww).sum()
            cnt += ww.sum()
            out.append(float(np.sqrt(tot / cnt)))
        return out

    reg = [(f32(rng.normal(size=(n, 3))), f32(rng.normal(size=(n, 3))), f32(rng.uniform(0, 2, n)) if i else None)
           for i in range(nb)]
    add("rmse", "RootMeanSquaredError", {}, reg, rmse(reg))
    reg1 = [(f32(rng.normal(size=n)), f32(rng.normal(size=(n, 1))), None) for _ in range(nb)]
    add("rmse_n_vs_n1", "RootMeanSquaredError", {}, reg1, rmse(reg1))

    # MeanIoU.
    def miou(batches, k, ignore=None, sparse_true=True, sparse_pred=True):
        cm = np.zeros((k, k))
        out = []
        for y, p, w in batches:
            yt = (y if sparse_true else y.argmax(-1)).reshape(-1).astype(np.int64)
            yp = (p if sparse_pred else p.argmax(-1)).reshape(-1).astype(np.int64)
            ww = np.ones(len(yt)) if w is None else np.broadcast_to(w.reshape(-1), yt.shape).astype(np.float64)
            for a, b, wi in zip(yt, yp, ww):
                if ignore is not None and a == ignore:
                    continue
                cm[a, b] += wi
            ious = []
            for cls in range(k):
                tp = cm[cls, cls]
                union = cm[cls, :].sum() + cm[:, cls].sum() - tp
                if union > 1e-9:
                    ious.append(tp / (union + eps))
            out.append(float(sum(ious) / (len(ious) + eps)))
        return out

    k = 4
    seg = [(f32(rng.integers(0, k, (2, 3, 3))), f32(rng.integers(0, k, (2, 3, 3))),
            f32(rng.uniform(0.5, 1.5, (2, 3, 3))) if i == 2 else None) for i in range(nb)]
    add("mean_iou_sparse", "MeanIoU", {"num_classes": k}, seg, miou(seg, k))
    # A class never seen (5 classes, ids 0..3 only) is left out of the mean.
    add("mean_iou_unseen_class", "MeanIoU", {"num_classes": 5}, seg, miou(seg, 5))
    seg_ign = [(np.where(b[0] == 3, np.float32(-1), b[0]), b[1], b[2]) for b in seg]
    add("mean_iou_ignore_class", "MeanIoU", {"num_classes": k, "ignore_class": -1}, seg_ign,
        miou(seg_ign, k, ignore=-1))
    dense = [(f32(np.eye(k)[rng.integers(0, k, n)]), f32(rng.uniform(size=(n, k))), None) for _ in range(nb)]
    add("mean_iou_dense", "MeanIoU", {"num_classes": k, "sparse_y_true": False, "sparse_y_pred": False}, dense,
        miou(dense, k, sparse_true=False, sparse_pred=False))

    # R2.
    def r2(batches, agg="uniform_average", p_reg=0):
        st = None
        nsamp = 0
        out = []
        for y, p, w in batches:
            y = y.astype(np.float64)
            p = p.astype(np.float64)
            if y.ndim == 1:
                y = y[:, None]
            ww = np.ones_like(y) if w is None else np.broadcast_to(
                (w[:, None] if w.ndim == 1 else w).astype(np.float64), y.shape)
            parts = [(y * ww).sum(0), (y * y * ww).sum(0), ((y - p) ** 2 * ww).sum(0), ww.sum(0)]
            st = parts if st is None else [a + b for a, b in zip(st, parts)]
            nsamp += y.size
            s, sq, sse, cnt = st
            total = sq - s * (s / cnt)
            raw = 1 - sse / total
            raw = np.where(np.isinf(raw), 0.0, raw)
            if agg == "uniform_average":
                r = float(raw.mean())
            elif agg == "variance_weighted_average":
                r = float((total * raw).sum() / total.sum())
            else:
                r = raw
            if p_reg and p_reg < nsamp - 1:
                r = 1 - (1 - r) * (nsamp - 1) / (nsamp - p_reg - 1)
            out.append([float(v) for v in r] if agg is None else float(r))
        return out

    yr = [(f32(rng.normal(size=(n, 3)) * [1, 2, 5]), None, None) for _ in range(nb)]
    yr = [(y, f32(y + rng.normal(size=y.shape)), f32(rng.uniform(0.5, 2, n)) if i == 1 else None)
          for i, (y, _, _) in enumerate(yr)]
    # Independent check: unweighted, one batch, R2 per output = 1 - SSE / (n var(y)).
    y0, p0 = yr[0][0].astype(np.float64), yr[0][1].astype(np.float64)
    direct = 1 - ((y0 - p0) ** 2).sum(0) / (len(y0) * y0.var(0))
    assert np.allclose(r2([yr[0]], None)[0], direct), "R2 reference"
    add("r2_uniform", "R2Score", {}, yr, r2(yr))
    add("r2_variance_weighted", "R2Score", {"class_aggregation": "variance_weighted_average"}, yr,
        r2(yr, "variance_weighted_average"))
    add("r2_per_output", "R2Score", {"class_aggregation": None}, yr, r2(yr, None))
    add("r2_adjusted", "R2Score", {"num_regressors": 3}, yr, r2(yr, p_reg=3))
    y1 = [(f32(rng.normal(size=n)), f32(rng.normal(size=(n, 1))), None) for _ in range(2)]
    add("r2_n_vs_n1", "R2Score", {}, y1, r2(y1))
    return cases


# ----------------------------------------------------------------------------
# Recurrent layers (kiln/layers/recurrent.h) against torch.nn.LSTM/GRU/RNN
# ----------------------------------------------------------------------------
# Keras keeps one kernel (features, gates*units) with gates side by side in
# columns (LSTM i,f,c,o; GRU z,r,h), a recurrent_kernel (units, gates*units)
# and one bias (GRU reset_after: two rows, input and recurrent). torch keeps
# weight_ih (gates*units, features) with gates stacked in rows (LSTM i,f,g,o;
# GRU r,z,n) and two biases. The maps below turn torch's parameters into
# Keras's layout; the gradients map back the same (linear) way.

RNN_GEN = torch.Generator().manual_seed(20261125)


def rrandn(*shape):
    return torch.randn(*shape, generator=RNN_GEN).float() * 0.5


def keras_gates(w, units, order):
    """Rows of a torch (gates*units, n) matrix in torch's gate order -> the
    columns of Keras's (n, gates*units) in Keras's order. `order` lists, for
    each Keras gate, its torch gate index."""
    blocks = [w[g * units:(g + 1) * units] for g in order]
    return torch.cat(blocks, 0).t()


# Keras gate k = torch gate ORDER[k]: LSTM i,f,c,o = torch i,f,g,o; GRU z,r,h = torch z(1),r(0),n(2).
ORDER = {"LSTM": [0, 1, 2, 3], "GRU": [1, 0, 2], "SimpleRNN": [0]}
TORCH_RNN = {"LSTM": torch.nn.LSTM, "GRU": torch.nn.GRU, "SimpleRNN": torch.nn.RNN}


def keras_weights(mod, cls, units, suffix=""):
    """kernel, recurrent_kernel, bias in Keras's layout, as autograd
    functions of the torch module's parameters."""
    o = ORDER[cls]
    w_ih = getattr(mod, "weight_ih_l0" + suffix)
    w_hh = getattr(mod, "weight_hh_l0" + suffix)
    b_ih = getattr(mod, "bias_ih_l0" + suffix)
    b_hh = getattr(mod, "bias_hh_l0" + suffix)
    kernel = keras_gates(w_ih, units, o)
    rec = keras_gates(w_hh, units, o)
    bi = keras_gates(b_ih.unsqueeze(1), units, o).reshape(-1)
    bh = keras_gates(b_hh.unsqueeze(1), units, o).reshape(-1)
    if cls == "GRU":  # reset_after: the recurrent bias stays inside r * (h U + b_hh)
        bias = torch.stack([bi, bh])
    else:  # LSTM, SimpleRNN: the two biases only ever appear summed
        bias = bi + bh
    return [kernel, rec, bias]


def keras_from_torch_grads(mod, cls, units, suffix=""):
    """Gradients of Keras's kernel, recurrent_kernel, bias from torch's."""
    o = ORDER[cls]
    g = lambda n: getattr(mod, n + "_l0" + suffix).grad
    kernel = keras_gates(g("weight_ih"), units, o)
    rec = keras_gates(g("weight_hh"), units, o)
    bi = keras_gates(g("bias_ih").unsqueeze(1), units, o).reshape(-1)
    bh = keras_gates(g("bias_hh").unsqueeze(1), units, o).reshape(-1)
    bias = torch.stack([bi, bh]) if cls == "GRU" else bi  # d/d(bi+bh) = d/dbi = d/dbh
    return [kernel, rec, bias]


def hold_masked(seq, lengths):
    """Keras's masked outputs for post-padded sequences: steps past a
    sequence's length repeat its last valid output (torch pads zeros)."""
    b, t, _ = seq.shape
    steps = torch.arange(t).unsqueeze(0)
    valid = (steps < torch.tensor(lengths).unsqueeze(1)).unsqueeze(2)
    last = seq[torch.arange(b), torch.tensor(lengths) - 1].unsqueeze(1)
    return torch.where(valid, seq, last.expand_as(seq))


def run_torch_rnn(cls, mod, x, lengths, bidirectional, go_backwards):
    """torch's outputs in Keras's terms: [sequence, final states...]."""
    if go_backwards:
        x = x.flip(1)
    if lengths is not None:
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, st = mod(packed)
        out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
    else:
        out, st = mod(x)
    states = list(st) if cls == "LSTM" else [st]
    if lengths is not None:
        if bidirectional:
            # Keras's backward layer meets the padding first (masked: its
            # output stays the initial zeros), so after re-reversal its
            # padded steps are zeros, as torch's.
            u = out.shape[2] // 2
            out = torch.cat([hold_masked(out[..., :u], lengths), out[..., u:]], 2)
        else:
            out = hold_masked(out, lengths)
    if bidirectional:
        # Keras: forward states, then backward states.
        finals = [s[0] for s in states] + [s[1] for s in states]
    else:
        finals = [s[0] for s in states]
    return out, finals


def gru_reset_before_reference(x, kernel, rec, bias, units):
    """Keras's GRU with reset_after=False (no torch equivalent): the
    original formula h~ = tanh(x Wh + bh + (r * h) Uh), h' = z h + (1-z) h~."""
    b, t, _ = x.shape
    h = torch.zeros(b, units)
    outs = []
    for s in range(t):
        xw = x[:, s] @ kernel + bias
        xz, xr, xh = xw.split(units, 1)
        z = torch.sigmoid(xz + h @ rec[:, :units])
        r = torch.sigmoid(xr + h @ rec[:, units:2 * units])
        hh = torch.tanh(xh + (r * h) @ rec[:, 2 * units:])
        h = z * h + (1 - z) * hh
        outs.append(h)
    return torch.stack(outs, 1), [h]


def recurrent_cases():
    b, t, f, u = 3, 5, 4, 3
    specs = [
        ("lstm", "LSTM", {}, None, False),
        ("lstm_go_backwards", "LSTM", {"go_backwards": True}, None, False),
        ("lstm_masked", "LSTM", {}, [5, 3, 1], False),
        ("gru", "GRU", {}, None, False),
        ("gru_go_backwards", "GRU", {"go_backwards": True}, None, False),
        ("simple_rnn", "SimpleRNN", {}, None, False),
        ("simple_rnn_masked", "SimpleRNN", {}, [4, 1, 5], False),
        ("bidirectional_lstm", "LSTM", {}, None, True),
        ("bidirectional_gru_masked", "GRU", {}, [5, 2, 3], True),
    ]
    cases = []
    for name, cls, extra, lengths, bidirectional in specs:
        go_backwards = extra.get("go_backwards", False)
        mod = TORCH_RNN[cls](f, u, batch_first=True, bidirectional=bidirectional)
        with torch.no_grad():
            for p in mod.parameters():
                p.copy_(rrandn(*p.shape))
        x = rrandn(b, t, f)
        if lengths is not None:  # padding holds garbage: the mask must hide it
            x = x.clone()
            for i, n in enumerate(lengths):
                x[i, n:] = 7.0
        x.requires_grad_(True)
        seq, finals = run_torch_rnn(cls, mod, x, lengths, bidirectional, go_backwards)
        if go_backwards and lengths is not None:
            raise ValueError("go_backwards with a mask: written below instead")
        outputs = [seq] + finals
        rs = [rrandn(*o.shape) for o in outputs]
        sum(((o * r).sum() for o, r in zip(outputs, rs))).backward()
        weights = keras_weights(mod, cls, u)
        grads = keras_from_torch_grads(mod, cls, u)
        if bidirectional:
            weights += keras_weights(mod, cls, u, "_reverse")
            grads += keras_from_torch_grads(mod, cls, u, "_reverse")
        config = dict({"units": u, "return_sequences": True, "return_state": True}, **extra)
        if cls == "SimpleRNN":
            config["activation"] = "tanh"
        layer = {"class_name": cls, "config": config}
        if bidirectional:
            layer = {"class_name": "Bidirectional", "config": {"layer": layer, "merge_mode": "concat"}}
        cases.append({
            "name": name, "layer": layer, "x": T(x), "lengths": lengths,
            "weights": [T(w) for w in weights], "r": [T(r) for r in rs],
            "outputs": [T(o) for o in outputs], "x_grad": T(x.grad), "weight_grads": [T(g) for g in grads],
        })
    return cases


def recurrent_extra_cases():
    """Cases torch's modules do not cover: GRU reset_after=False (a
    reference loop of the formula), and a masked go_backwards GRU (torch
    with the valid steps reversed per sequence)."""
    b, t, f, u = 3, 5, 4, 3
    cases = []
    x = rrandn(b, t, f).requires_grad_(True)
    kernel = rrandn(f, 3 * u).requires_grad_(True)
    rec = rrandn(u, 3 * u).requires_grad_(True)
    bias = rrandn(3 * u).requires_grad_(True)
    seq, finals = gru_reset_before_reference(x, kernel, rec, bias, u)
    outputs = [seq] + finals
    rs = [rrandn(*o.shape) for o in outputs]
    sum(((o * r).sum() for o, r in zip(outputs, rs))).backward()
    cases.append({
        "name": "gru_reset_before", "lengths": None,
        "layer": {"class_name": "GRU", "config": {"units": u, "reset_after": False, "return_sequences": True,
                                                  "return_state": True}},
        "x": T(x), "weights": [T(kernel), T(rec), T(bias)], "r": [T(r) for r in rs],
        "outputs": [T(o) for o in outputs], "x_grad": T(x.grad),
        "weight_grads": [T(kernel.grad), T(rec.grad), T(bias.grad)],
    })

    # Masked go_backwards, post-padded: Keras processes the padding first
    # (masked: the state stays zero, outputs zero), then the valid steps in
    # reverse. So the final state is torch's GRU on each sequence's valid
    # steps reversed, and the output at processed step k is torch's output
    # at step k - (T - n) (zero before it).
    lengths = [2, 5, 4]
    mod = torch.nn.GRU(f, u, batch_first=True)
    with torch.no_grad():
        for p in mod.parameters():
            p.copy_(rrandn(*p.shape))
    x = rrandn(b, t, f)
    for i, n in enumerate(lengths):
        x[i, n:] = 7.0
    x.requires_grad_(True)
    seqs, finals = [], []
    for i, n in enumerate(lengths):
        out, h = mod(x[i:i + 1, :n].flip(1))
        seqs.append(torch.cat([torch.zeros(1, t - n, u), out], 1))
        finals.append(h[0])
    outputs = [torch.cat(seqs, 0), torch.cat(finals, 0)]
    rs = [rrandn(*o.shape) for o in outputs]
    sum(((o * r).sum() for o, r in zip(outputs, rs))).backward()
    cases.append({
        "name": "gru_masked_go_backwards", "lengths": lengths,
        "layer": {"class_name": "GRU", "config": {"units": u, "go_backwards": True, "return_sequences": True,
                                                  "return_state": True}},
        "x": T(x), "weights": [T(w) for w in keras_weights(mod, "GRU", u)], "r": [T(r) for r in rs],
        "outputs": [T(o) for o in outputs], "x_grad": T(x.grad),
        "weight_grads": [T(g) for g in keras_from_torch_grads(mod, "GRU", u)],
    })
    return cases


def main():
    torch.set_num_threads(1)
    header = {"generator": "scripts/golden/make_golden.py", "torch": torch.__version__}
    write("kiln/layers/testdata/new_layers_golden.json", dict(header, cases=layer_cases()))
    if sys.argv[1:] == ["layers"]:  # only the layers section
        return
    write("kiln/losses/testdata/losses_golden.json", dict(header, cases=loss_cases()))
    write("kiln/metrics/testdata/metrics_golden.json", dict(header, cases=metric_cases()))
    write("kiln/losses/testdata/keras3_losses_golden.json", dict(header, cases=keras3_loss_cases()))
    write("kiln/metrics/testdata/keras3_metrics_golden.json", dict(header, cases=keras3_metric_cases()))
    write("kiln/optimizers/testdata/optimizers_golden.json",
          dict(header, cases=optimizer_cases(), schedules=schedule_cases()))
    write("kiln/optimizers/testdata/keras3_optimizers_golden.json", dict(header, cases=keras3_optimizer_cases(), schedules=keras3_schedule_cases()))
    write("kiln/layers/testdata/recurrent_golden.json",
          dict(header, cases=recurrent_cases() + recurrent_extra_cases()))


if __name__ == "__main__":
    main()
