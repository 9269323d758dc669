"""Runs an ONNX model with ONNX Runtime (CPU, PyPI's onnxruntime) and prints its outputs as JSON.

    python scripts/onnx_run.py model.onnx inputs.json

inputs.json: {"<input name>": {"dtype": "float32"|"int64"|"int32"|"string", "shape": [...], "data": [...]}, ...}
stdout:      {"<output name>": {"shape": [...], "data": [...]}, ...}

kiln_export_test runs it (with .venv's python, which scripts/setup.sh gives onnxruntime) to check
`kiln export --format onnx` against a real ONNX runtime.
"""
import json
import sys

import numpy as np
import onnxruntime as ort

DTYPES = {"float32": np.float32, "int32": np.int32, "int64": np.int64, "string": object}


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: onnx_run.py model.onnx inputs.json")
    model_path, inputs_path = sys.argv[1:]
    with open(inputs_path) as f:
        spec = json.load(f)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
    feeds = {}
    for name, t in spec.items():
        dtype = t.get("dtype", "float32")
        if dtype not in DTYPES:
            sys.exit(f"onnx_run: input {name}: unsupported dtype {dtype}")
        feeds[name] = np.asarray(t["data"], dtype=DTYPES[dtype]).reshape(t["shape"])
    names = [o.name for o in session.get_outputs()]
    results = session.run(names, feeds)
    out = {n: {"shape": list(r.shape), "data": np.asarray(r, dtype=np.float64).ravel().tolist()} for n, r in zip(names, results)}
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # one line, as the node version did
        sys.stderr.write(f"onnx_run: {e}\n")
        sys.exit(1)
