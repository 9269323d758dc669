"""The peer server of bench/serving_bench.sh: Flask + PyTorch under gunicorn,
serving the same weights as kiln serve, with the same REST route and body.

    KILN_MODEL_DIR=models/m/1 KILN_MODEL_NAME=m gunicorn -w 2 -b 127.0.0.1:8000 \
        --chdir bench 'serving_flask:create_app()'

POST /v1/models/<name>:predict {"instances": [[...]]} -> {"predictions": [[...]]}

The model is rebuilt from the kiln model directory: model.json (a
Sequential of Flatten / Dense / Dropout layers) and weights.safetensors,
read here by hand (8-byte little-endian header length, JSON header, raw
little-endian tensors), so no kiln code runs in this server. Runs with
torch, Flask and gunicorn from .venv (scripts/setup.sh): .venv/bin/gunicorn.
"""

import json
import os
import struct

import numpy as np
import torch
from flask import Flask, jsonify, request

_DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I64": np.int64, "I32": np.int32}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _DTYPES:
            raise ValueError(f"{path}: tensor {name} has dtype {info['dtype']}, which this peer does not read")
        start, end = info["data_offsets"]
        arr = np.frombuffer(data[base + start : base + end], dtype=_DTYPES[info["dtype"]]).reshape(info["shape"])
        out[name] = torch.from_numpy(arr.copy())
    return out


def _weight(weights, layer, leaf):
    hits = [k for k in weights if k.endswith(f"/{layer}/{leaf}")]
    if len(hits) != 1:
        raise ValueError(f"expected one weight named */{layer}/{leaf}, found {hits}")
    return weights[hits[0]]


def _activation(name):
    if name in (None, "linear"):
        return None
    if name == "relu":
        return torch.nn.ReLU()
    if name == "softmax":
        return torch.nn.Softmax(dim=-1)
    raise ValueError(f"activation {name!r} is not supported by this peer")


def build_model(model_dir):
    """torch.nn.Sequential equal to the kiln Sequential saved in model_dir."""
    with open(os.path.join(model_dir, "model.json")) as f:
        mj = json.load(f)
    if mj["class_name"] != "Sequential":
        raise ValueError(f"{model_dir}: only Sequential models are supported, got {mj['class_name']}")
    weights = read_safetensors(os.path.join(model_dir, mj["weights"]))
    mods = []
    for layer in mj["config"]["layers"]:
        kind, cfg = layer["class_name"], layer["config"]
        if kind == "Dense":
            kernel = _weight(weights, cfg["name"], "kernel")  # (in, units), as Keras stores it
            lin = torch.nn.Linear(kernel.shape[0], kernel.shape[1], bias=cfg.get("use_bias", True))
            with torch.no_grad():
                lin.weight.copy_(kernel.t())
                if lin.bias is not None:
                    lin.bias.copy_(_weight(weights, cfg["name"], "bias"))
            mods.append(lin)
            act = _activation(cfg.get("activation"))
            if act is not None:
                mods.append(act)
        elif kind == "Flatten":
            mods.append(torch.nn.Flatten())
        elif kind in ("Dropout", "InputLayer"):
            continue  # identity at inference
        else:
            raise ValueError(f"layer {kind} is not supported by this peer")
    return torch.nn.Sequential(*mods).eval()


def create_app():
    torch.set_num_threads(int(os.environ.get("KILN_PEER_THREADS", "1")))
    model_dir = os.environ["KILN_MODEL_DIR"]
    name = os.environ.get("KILN_MODEL_NAME", "model")
    model = build_model(model_dir)
    app = Flask(__name__)

    @app.post(f"/v1/models/{name}:predict")
    def predict():
        body = request.get_json(force=True)
        x = torch.tensor(body["instances"], dtype=torch.float32)
        with torch.inference_mode():
            y = model(x)
        return jsonify({"predictions": y.tolist()})

    return app


if __name__ == "__main__":
    # Self-check: python3 serving_flask.py MODEL_DIR BODY.json prints the predictions.
    import sys

    m = build_model(sys.argv[1])
    with open(sys.argv[2]) as f:
        x = torch.tensor(json.load(f)["instances"], dtype=torch.float32)
    with torch.inference_mode():
        print(json.dumps({"predictions": m(x).tolist()}))
