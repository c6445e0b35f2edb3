"""Dozens of concurrent readers and a writer at once all get exact data."""
import hashlib
import subprocess
import threading

import numpy as np

from conftest import CAIRN
from stfiles import rand, save_file


def test_many_readers_and_a_writer(make_daemon, tmp):
    d = make_daemon(dram="512MiB").start()
    rng = np.random.default_rng(30)
    src = {}
    for i in range(3):
        f = tmp / f"r{i}.safetensors"
        save_file({"a": rand(rng, (2048, 1024), np.float32), "b": rand(rng, (33, 77), np.float32)}, str(f))
        d.cairn("put", f"r{i}", f)
        src[f"r{i}"] = hashlib.sha256(f.read_bytes()).hexdigest()

    errors = []

    def writer():
        try:
            wrng = np.random.default_rng(31)
            for i in range(6):
                f = tmp / f"w{i}.safetensors"
                save_file({"a": rand(wrng, (1024, 1024), np.float32)}, str(f))
                d.cairn("put", f"w{i}", f, "--durability", "memory" if i % 2 else "global")
        except Exception as e:  # noqa: BLE001
            errors.append(f"writer: {e}")

    readers = []
    for k in range(32):
        mid = f"r{k % 3}"
        out = tmp / f"out{k}.safetensors"
        readers.append((mid, out, subprocess.Popen([str(CAIRN), "get", mid, "-o", str(out)], env=d.env,
                                                    stderr=subprocess.PIPE)))
    t = threading.Thread(target=writer)
    t.start()
    for mid, out, p in readers:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        assert hashlib.sha256(out.read_bytes()).hexdigest() == src[mid]
    t.join()
    assert not errors, errors
    assert d.stats()["repository"]["models"] >= 3
