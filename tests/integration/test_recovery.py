"""After kill -9 and a restart every model committed `global` is there and exact; SIGTERM drains
models acknowledged at `memory` to the repository before the daemon exits."""
import signal

import numpy as np

from stfiles import load_file, rand, save_file


def test_kill9_loses_nothing_committed_global(make_daemon, tmp):
    d = make_daemon().start()
    rng = np.random.default_rng(20)
    files = {}
    for i in range(5):
        t = {"shared": rand(np.random.default_rng(99), (512, 512), np.float32),
             "own": rand(rng, (300, 700), np.float32)}
        files[f"m{i}"] = tmp / f"m{i}.safetensors"
        save_file(t, str(files[f"m{i}"]))
        d.cairn("put", f"m{i}", files[f"m{i}"], *(["--parent", f"m{i-1}"] if i else []))
    keys = ("models", "retired", "packs", "chunks", "logical_bytes", "physical_bytes")
    stats = {k: d.stats()["repository"][k] for k in keys}
    d.kill9()
    d.start()
    assert {k: d.stats()["repository"][k] for k in keys} == stats
    for mid, f in files.items():
        out = tmp / f"{mid}.out"
        d.cairn("get", mid, "-o", out)
        assert out.read_bytes() == f.read_bytes()
    assert d.stop() == 0


def test_sigterm_drains_memory_commits(make_daemon, tmp):
    d = make_daemon().start()
    rng = np.random.default_rng(21)
    files = {}
    for i in range(8):
        files[f"mem{i}"] = tmp / f"mem{i}.safetensors"
        save_file({"w": rand(rng, (1024, 1024), np.float32)}, str(files[f"mem{i}"]))
        d.cairn("put", f"mem{i}", files[f"mem{i}"], "--durability", "memory")
    assert d.stop(signal.SIGTERM) == 0
    d.start()
    for mid, f in files.items():
        out = tmp / f"{mid}.out"
        d.cairn("get", mid, "-o", out)
        assert np.array_equal(load_file(str(out))["w"], load_file(str(f))["w"])
    assert d.stats()["pending_models"] == 0
