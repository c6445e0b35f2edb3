"""Writing safetensors files the way other tools do (PyPI safetensors), plus a minimal writer for
the dtypes numpy lacks (BF16, F8) that follows the same layout rules as the reference writer."""
import json
import struct

import numpy as np
from safetensors.numpy import save_file, load_file  # noqa: F401  (re-exported)


def write_raw(path, tensors, metadata=None):
    """tensors: list of (name, dtype string, shape, bytes). Sorted like the reference writer
    (by alignment, then name), offsets contiguous, header padded with spaces to 8 bytes."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    off = 0
    blobs = []
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        off += len(data)
        blobs.append(data)
    js = json.dumps(header, separators=(",", ":")).encode()
    js += b" " * ((8 - (8 + len(js)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(js)))
        f.write(js)
        for b in blobs:
            f.write(b)


def write_header_only(path, header_obj, data=b"", raw_header=None, declared_len=None):
    js = raw_header if raw_header is not None else json.dumps(header_obj).encode()
    n = declared_len if declared_len is not None else len(js)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", n))
        f.write(js)
        f.write(data)


def rand(rng, shape, dtype):
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    return rng.standard_normal(size=shape).astype(dtype)
