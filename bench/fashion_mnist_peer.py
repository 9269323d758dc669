"""Keras's Fashion-MNIST loader (keras.datasets.fashion_mnist.load_data):
each file gunzipped whole with Python's gzip module, the bytes kept as they
are (Keras wraps them with np.frombuffer, no copy). Prints {"seconds": ...}
for reading the files given on the command line once."""
import gzip
import json
import sys
import time

start = time.perf_counter()
for path in sys.argv[1:]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds}))
