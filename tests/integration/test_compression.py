"""Coded chunks through a real daemon (docs/repository-format.md, "Coded chunks"): weights reach the
repository coded, a fine-tune as deltas against its parent, and every way out (a warm read, a cold
read after a restart, `cairn get`, `cairn export`, `cairn fsck --verify`) gives the exact bytes;
`cairn stats`, `cairn show` and `cairn du` say what coding saved."""
import json

import numpy as np
from safetensors.numpy import load_file

from stfiles import save_file


def weights(rng, shape, dtype, base=None, step=1e-3):
    """Values like initialized or lightly trained layers: N(0, 0.02), or base moved by a small step."""
    w = rng.standard_normal(shape) * 0.02
    if base is not None:
        w = base.astype(np.float64) + step * w
    return w.astype(dtype)


def model(rng, base=None):
    b = base or {}
    return {
        "encoder.weight": weights(rng, (512, 1024), np.float32, b.get("encoder.weight")),  # 2 MiB
        "decoder.weight": weights(rng, (1024, 512), np.float16, b.get("decoder.weight")),  # 1 MiB
        "head.bias": weights(rng, (1000,), np.float64, b.get("head.bias")),
        "tokens": (b["tokens"] if base else rng.integers(0, 255, 4096, dtype=np.uint8)),
    }


def test_weights_and_a_fine_tune_are_stored_coded_and_read_back_exact(make_daemon, tmp):
    d = make_daemon("d").start()
    rng = np.random.default_rng(1)
    base = model(rng)
    tune = model(rng, base)
    save_file(base, str(tmp / "base.safetensors"))
    save_file(tune, str(tmp / "tune.safetensors"))
    d.cairn("put", "base", tmp / "base.safetensors")
    d.cairn("put", "tune", tmp / "tune.safetensors", "--parent", "base")
    d.cairn("flush")

    repo = d.stats()["repository"]
    logical = sum(v.nbytes for v in base.values()) + sum(v.nbytes for v in tune.values())
    assert repo["logical_bytes"] == logical
    # "tokens" is shared: stored once. The floats are coded: the repository holds less than the raw bytes.
    assert repo["physical_bytes"] == logical - tune["tokens"].nbytes
    assert repo["stored_bytes"] < 0.9 * repo["physical_bytes"], repo
    codings = repo["codings"]
    assert codings["planes"]["chunks"] >= 2 and codings["delta"]["chunks"] >= 2, codings
    assert sum(c["stored"] for c in codings.values()) == repo["stored_bytes"]
    assert "coding)" in d.cairn("stats").stdout

    shown = json.loads(d.cairn("show", "tune").stdout)
    storage = shown["storage"]
    assert storage["codings"]["delta"] >= 2 and storage["ancestors"] == 1
    assert storage["own_stored_bytes"] < 0.5 * storage["own_raw_bytes"], storage  # deltas code small
    assert storage["lineage_stored_bytes"] == repo["stored_bytes"]

    du = json.loads(d.cairn("du", "--json").stdout)["models"]
    assert [m["id"] for m in du] == ["base", "tune"]
    assert du[0]["storage"]["own_stored_bytes"] == du[0]["storage"]["stored_bytes"]
    text = d.cairn("du", "tune").stdout
    assert text.splitlines()[0].split()[:3] == ["ID", "LOGICAL", "STORED"] and "tune" in text

    def check(path, want):
        got = load_file(str(path))
        assert set(got) == set(want)
        for k in want:
            assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]), k

    # Warm, then cold from the repository alone (a new daemon: nothing in memory), byte for byte.
    d.cairn("get", "tune", "--output", tmp / "warm.safetensors")
    assert (tmp / "warm.safetensors").read_bytes() == (tmp / "tune.safetensors").read_bytes()
    d.stop()
    d.start()
    d.cairn("get", "tune", "--output", tmp / "cold.safetensors")
    assert (tmp / "cold.safetensors").read_bytes() == (tmp / "tune.safetensors").read_bytes()
    d.cairn("get", "base", "--output", tmp / "cold-base.safetensors")
    assert (tmp / "cold-base.safetensors").read_bytes() == (tmp / "base.safetensors").read_bytes()
    # Cold again, the parent first: its chunks in DRAM are the fine-tune's deltas' bases.
    d.stop()
    d.start()
    d.cairn("get", "base", "--output", tmp / "cold-base-2.safetensors")
    d.cairn("get", "tune", "--output", tmp / "cold-2.safetensors")
    assert (tmp / "cold-2.safetensors").read_bytes() == (tmp / "tune.safetensors").read_bytes()
    d.cairn("export", "tune", tmp / "exported.safetensors")
    check(tmp / "exported.safetensors", tune)
    f = json.loads(d.cairn("fsck", "--json").stdout)  # reads, decodes and checks every chunk
    assert f["ok"] and not f["dangling"] and f["bytes_verified"] == logical, f

    # The parent retired and collected: the deltas' bases stay, the fine-tune reads exact.
    d.cairn("rm", "base")
    d.cairn("gc")
    d.stop()
    d.start()
    d.cairn("get", "tune", "--output", tmp / "after-gc.safetensors")
    assert (tmp / "after-gc.safetensors").read_bytes() == (tmp / "tune.safetensors").read_bytes()


def test_compression_off_stores_chunks_raw(make_daemon, tmp):
    d = make_daemon("d", extra_config="repository_compression: off\n").start()
    rng = np.random.default_rng(2)
    base = model(rng)
    save_file(base, str(tmp / "base.safetensors"))
    d.cairn("put", "base", tmp / "base.safetensors")
    d.cairn("flush")
    repo = d.stats()["repository"]
    assert repo["stored_bytes"] == repo["physical_bytes"]
    assert repo["codings"]["planes"]["chunks"] == 0 and repo["codings"]["delta"]["chunks"] == 0
