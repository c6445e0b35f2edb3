"""One candidate of the Swift/T NAS example (workflow/examples/nas.swift): reads its parent's weights
from a safetensors file, trains one layer of the small MLP for a few SGD steps on a synthetic
regression task (the other layer stays exactly its parent's, so cairn stores it once), writes the
child's weights and prints its score (the negated validation loss).

    python3 nas_swift_candidate.py PARENT.safetensors CHILD.safetensors SEED
    python3 nas_swift_candidate.py --init BASE.safetensors [--width N]   # generation 0
"""
import sys

import numpy as np
from safetensors.numpy import load_file, save_file

IN, OUT = 32, 4


def task(seed=1234, n=512):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, IN)).astype(np.float32)
    w = rng.standard_normal((IN, OUT)).astype(np.float32) / np.sqrt(IN)
    y = np.tanh(x @ w) + 0.05 * rng.standard_normal((n, OUT)).astype(np.float32)
    return x[: n // 2], y[: n // 2], x[n // 2:], y[n // 2:]


def forward(p, x):
    h = np.maximum(x @ p["l0.weight"] + p["l0.bias"], 0)
    return h, h @ p["l1.weight"] + p["l1.bias"]


def loss(p, x, y):
    return float(np.mean((forward(p, x)[1] - y) ** 2))


def train(p, layer, seed, steps=30, lr=0.05):
    x, y, _, _ = task()
    rng = np.random.default_rng(seed)
    p = {k: v.copy() for k, v in p.items()}
    for _ in range(steps):
        i = rng.choice(len(x), 64, replace=False)
        xb, yb = x[i], y[i]
        h, out = forward(p, xb)
        g = 2 * (out - yb) / len(xb)
        if layer == 1:
            p["l1.weight"] -= lr * (h.T @ g)
            p["l1.bias"] -= lr * g.sum(0)
        else:
            gh = (g @ p["l1.weight"].T) * (h > 0)
            p["l0.weight"] -= lr * (xb.T @ gh)
            p["l0.bias"] -= lr * gh.sum(0)
    return p


def main(argv):
    if argv[1] == "--init":
        width = int(argv[argv.index("--width") + 1]) if "--width" in argv else 256
        rng = np.random.default_rng(0)
        save_file({"l0.weight": (rng.standard_normal((IN, width)) / np.sqrt(IN)).astype(np.float32),
                   "l0.bias": np.zeros(width, np.float32),
                   "l1.weight": (rng.standard_normal((width, OUT)) / np.sqrt(width)).astype(np.float32),
                   "l1.bias": np.zeros(OUT, np.float32)}, argv[2])
        return
    parent, child, seed = argv[1], argv[2], int(argv[3])
    p = train(load_file(parent), seed % 2, seed)
    save_file(p, child)
    _, _, xv, yv = task()
    print("%.6f" % -loss(p, xv, yv))


if __name__ == "__main__":
    main(sys.argv)
