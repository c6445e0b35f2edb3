"""What every byte the torture harness stores should be, so any read anywhere can be checked.

A tensor's bytes are a pure function of its content key, a string: the model that first wrote them
and the tensor's name ("w3-17/t2"), and its length. A child that inherits a tensor keeps the
parent's key, so the oracle knows every model's exact bytes from its spec alone:

    spec = {"tensors": {name: [key, nbytes], ...}, "parent": id or None, "durability": ...}

Nothing here needs a daemon; the worker and the controller both import it.
"""
import hashlib
import json

import numpy as np


def key_seed(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


def tensor_bytes(key: str, nbytes: int) -> np.ndarray:
    """The bytes under content key `key`: nbytes of a generator seeded by the key (uint8). Half the
    keys give the bytes of float32 weights, N(0, 0.02), which the repository stores coded (its byte
    planes entropy-coded): the faults then also hit coded chunks, their flush and their reads."""
    seed = key_seed(key)
    rng = np.random.default_rng(seed)
    if seed % 2:
        a = rng.standard_normal((nbytes + 3) // 4, dtype=np.float32) * np.float32(0.02)
        return a.view(np.uint8)[:nbytes]
    words = (nbytes + 7) // 8
    a = rng.integers(0, 2**63 - 1, size=words, dtype=np.int64)
    return a.view(np.uint8)[:nbytes]


def first_difference(got: np.ndarray, want: np.ndarray) -> str:
    """Where two byte arrays differ, in words ("" when they are equal)."""
    g = np.ascontiguousarray(got).reshape(-1).view(np.uint8)
    if g.size != want.size:
        return f"{g.size} bytes, expected {want.size}"
    if np.array_equal(g, want):
        return ""
    i = int(np.flatnonzero(g != want)[0])
    n = int(np.count_nonzero(g != want))
    return f"{n} of {want.size} bytes differ, the first at offset {i} ({g[i]:#04x}, expected {want[i]:#04x})"


def check_model(tensors, spec) -> str:
    """"" when `tensors` (name -> array, as load_model returns) are exactly the model `spec` describes,
    else what is wrong."""
    want = spec["tensors"]
    if sorted(tensors) != sorted(want):
        return f"tensors {sorted(tensors)}, expected {sorted(want)}"
    for name, (key, nbytes) in want.items():
        diff = first_difference(tensors[name], tensor_bytes(key, nbytes))
        if diff:
            return f"tensor {name!r} (content {key!r}): {diff}"
    return ""


def event(kind: str, **fields) -> str:
    """One line of the worker -> controller protocol (JSON)."""
    fields["ev"] = kind
    return json.dumps(fields, separators=(",", ":"))
