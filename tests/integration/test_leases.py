"""Leases end with the connection: a reader killed while it maps a model does not pin it forever."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np

from conftest import LIBCAIRN, ctypes_env
from stfiles import rand, save_file

READER = textwrap.dedent("""
    import ctypes, sys, time
    L = ctypes.CDLL(sys.argv[1])
    c = ctypes.c_void_p(); r = ctypes.c_void_p(); p = ctypes.c_void_p(); n = ctypes.c_size_t()
    assert L.cairn_connect(sys.argv[2].encode(), ctypes.byref(c)) == 0
    assert L.cairn_model_open(c, b"big0", ctypes.byref(r)) == 0
    assert L.cairn_model_map_tensor(r, b"w", ctypes.byref(p), ctypes.byref(n)) == 0
    print("mapped", n.value, flush=True)
    time.sleep(600)
""")


def test_killed_reader_releases_its_leases(make_daemon, tmp):
    d = make_daemon(dram="96MiB").start()
    rng = np.random.default_rng(40)
    save_file({"w": rand(rng, (40, 1024, 1024), np.uint8)}, str(tmp / "big0.safetensors"))
    save_file({"w": rand(rng, (60, 1024, 1024), np.uint8)}, str(tmp / "big3.safetensors"))
    d.cairn("put", "big0", tmp / "big0.safetensors")

    reader = subprocess.Popen([sys.executable, "-c", READER, str(LIBCAIRN), d.socket], stdout=subprocess.PIPE, text=True,
                              env=ctypes_env(d.env))
    assert reader.stdout.readline().startswith("mapped")
    # While big0 is mapped it cannot be evicted, so 60 MiB more do not fit in the 96 MiB arena...
    r = d.cairn("put", "big3", tmp / "big3.safetensors", check=False)
    assert r.returncode != 0 and "no space" in r.stderr, r.stderr
    reader.send_signal(signal.SIGKILL)
    reader.wait()
    # ...and once the reader has died its lease is gone: big0 is evicted to make room.
    deadline = time.time() + 10
    while True:
        r = d.cairn("put", "big3", tmp / "big3.safetensors", check=False)
        if r.returncode == 0 or time.time() > deadline:
            break
        time.sleep(0.1)
    assert r.returncode == 0, r.stderr
    d.cairn("get", "big0", "-o", tmp / "o0")
    assert (tmp / "o0").read_bytes() == (tmp / "big0.safetensors").read_bytes()
    assert d.alive()
