#!/usr/bin/python3
"""Golden data for kiln's losses, metrics, optimizers and schedules.

An independent reference written with PyTorch (Debian's python3-torch):
torch.nn.functional losses where their semantics equal Keras's, and plain
torch ops following Keras 3's documented formulas elsewhere; torch.optim.SGD
where its rule equals Keras's, reference loops for the rest (Keras puts
epsilon differently from torch in RMSprop and Adam), each loop checked here
against torch.optim with epsilon=0, where the two rules coincide.

Run from the repository root:
    /usr/bin/python3 scripts/golden/make_golden.py
It rewrites kiln/{losses,metrics,optimizers}/testdata/*_golden.json. The
inputs are generated with a fixed seed and stored next to the results.
"""
import json
import math
import os

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
    write("kiln/losses/testdata/losses_golden.json", dict(header, cases=loss_cases()))
    write("kiln/metrics/testdata/metrics_golden.json", dict(header, cases=metric_cases()))
    write("kiln/optimizers/testdata/optimizers_golden.json",
          dict(header, cases=optimizer_cases(), schedules=schedule_cases()))
    write("kiln/layers/testdata/recurrent_golden.json",
          dict(header, cases=recurrent_cases() + recurrent_extra_cases()))


if __name__ == "__main__":
    main()
