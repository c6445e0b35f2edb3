#!/usr/bin/env python3
"""The GPU tier against the plain CUDA ways of doing the same (issue 19's goals; docs/gpu.md).

  load      a tensor into device memory on a daemon-side miss (cairn_model_read_tensor with
            CAIRN_MEM_CUDA: read into the arena if needed, DMA from the registered arena into the HBM
            pool, then device-to-device into the caller's buffer) against a plain cudaMemcpy of the
            same bytes from pinned host memory. Goal: bandwidth ratio >= 0.9.
  hit       a tensor already in HBM, reached by a new reader (open, cairn_model_map_tensor_device:
            zero-copy through the slab's IPC handle, close) against a device-to-device copy of the
            same bytes. Goal: the map costs less than the copy.
  checkpoint  GPT-2-sized weights (124M float32 parameters; --quick: 1/10) on the device: the time
            cairn.torch.save(pipelined) blocks the caller against torch.save of the same state dict
            to a file. Goal: <= 1/10.

A daemon is started with tiers.hbm on device 0 (backend cuda) and stopped by pid. --emulated runs
load and hit on the emulated backend with host buffers (no GPU needed): a check of this driver's
plumbing, not a measurement of anything a GPU does.

Usage: bench/workloads/gpu_bench.py [--quick] [--emulated] [--json FILE]
Exit status 3, with the reason on stdout, when there is no GPU (bench/run reports the part as skipped).
"""
import argparse
import ctypes
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("CAIRN_BUILD_DIR", ROOT / "build"))
sys.path.insert(0, str(ROOT / "api" / "python"))
os.environ.setdefault("CAIRN_LIBRARY", str(BUILD / "lib" / "libcairn.so"))

import numpy as np  # noqa: E402

import cairn  # noqa: E402
from cairn import _errors  # noqa: E402

MEM_CUDA = 1


def start_daemon(tmp: Path, backend: str, hbm_bytes: int, dram_bytes: int) -> subprocess.Popen:
    sock = tmp / "cairnd.sock"
    (tmp / "cairn.yaml").write_text(
        f"socket: {sock}\nrepository: {tmp / 'repo'}\n"
        f"tiers:\n  dram: {{capacity: {dram_bytes}}}\n  hbm: {{capacity: {hbm_bytes}, backend: {backend}, devices: [0]}}\n"
        f"log: {{level: warn, file: {tmp / 'cairnd.log'}}}\n")
    p = subprocess.Popen([str(BUILD / "bin" / "cairnd"), "--config", str(tmp / "cairn.yaml")],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline:
        if p.poll() is not None:
            raise RuntimeError("cairnd exited: " + p.stderr.read().decode())
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(str(sock))
            s.close()
            return p
        except OSError:
            time.sleep(0.05)
    p.kill()
    raise RuntimeError("cairnd did not start")


class Device:
    """Device buffers and timing for the measurement: CUDA through torch, or host memory (emulated)."""

    def __init__(self, emulated: bool):
        self.emulated = emulated
        if not emulated:
            import torch
            self.torch = torch
            self.dev = torch.device("cuda", 0)

    def buffer(self, n: int):
        if self.emulated:
            a = np.empty(n, dtype=np.uint8)
            return a, a.ctypes.data
        t = self.torch.empty(n, dtype=self.torch.uint8, device=self.dev)
        return t, t.data_ptr()

    def sync(self):
        if not self.emulated:
            self.torch.cuda.synchronize(self.dev)

    def baseline_load(self, n: int, reps: int) -> float:
        """Seconds per plain host-to-device copy of n bytes from pinned memory (median)."""
        if self.emulated:
            src, dst = np.ones(n, dtype=np.uint8), np.empty(n, dtype=np.uint8)
            return median_time(lambda: ctypes.memmove(dst.ctypes.data, src.ctypes.data, n), reps, self.sync)
        src = self.torch.ones(n, dtype=self.torch.uint8).pin_memory()
        dst = self.torch.empty(n, dtype=self.torch.uint8, device=self.dev)
        return median_time(lambda: dst.copy_(src, non_blocking=True), reps, self.sync)

    def baseline_d2d(self, n: int, reps: int) -> float:
        a, _ = self.buffer(n)
        b, _ = self.buffer(n)
        if self.emulated:
            return median_time(lambda: ctypes.memmove(b.ctypes.data, a.ctypes.data, n), reps, self.sync)
        return median_time(lambda: b.copy_(a), reps, self.sync)


def median_time(fn, reps: int, sync) -> float:
    out = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def check(st: int) -> None:
    if st != 0:
        raise _errors.last_error(st)


def measure_load_and_hit(c, dev: Device, n: int, models: int, reps: int) -> dict:
    lib, conn = c._lib, c._conn
    rng = np.random.default_rng(1)
    for i in range(models):  # distinct bytes: every first read is a miss everywhere above DRAM
        c.save_model(f"gpu-bench/{i}", {"w": rng.integers(0, 255, n, dtype=np.uint8)}, durability="memory")
    dst, dst_ptr = dev.buffer(n)
    miss_s = []
    with conn.op() as h:
        for i in range(models):
            r = ctypes.c_void_p()
            check(lib.cairn_model_open(h, f"gpu-bench/{i}".encode(), ctypes.byref(r)))
            dev.sync()
            t0 = time.perf_counter()
            check(lib.cairn_model_read_tensor(r, b"w", dst_ptr, n, MEM_CUDA))
            dev.sync()
            miss_s.append(time.perf_counter() - t0)
            lib.cairn_model_close(r)
        # Hits: model 0 is in HBM now; a new reader maps it each time.
        hit_s = []
        for _ in range(reps):
            r = ctypes.c_void_p()
            ptr, got = ctypes.c_void_p(), ctypes.c_size_t()
            t0 = time.perf_counter()
            check(lib.cairn_model_open(h, b"gpu-bench/0", ctypes.byref(r)))
            check(lib.cairn_model_map_tensor_device(r, b"w", 0, ctypes.byref(ptr), ctypes.byref(got)))
            hit_s.append(time.perf_counter() - t0)
            lib.cairn_model_close(r)
    stats = c.stats()["tiers"]["hbm"]
    return {"bytes": n, "miss_s": statistics.median(miss_s), "hit_map_s": statistics.median(hit_s),
            "pinned_copy_s": dev.baseline_load(n, reps), "d2d_copy_s": dev.baseline_d2d(n, reps),
            "hbm_hits": stats["hits"], "hbm_misses": stats["misses"]}


def measure_checkpoint(c, params: int, tmp: Path) -> dict:
    import torch
    import cairn.torch as ct
    dev = torch.device("cuda", 0)
    # GPT-2 small's shapes, scaled: 12 blocks of attention and MLP weights plus embeddings.
    width = 768
    sd, left, i = {}, params, 0
    while left > 0:
        rows = min(4 * width, max(1, left // width))
        sd[f"h.{i}.w"] = torch.randn(rows, width, device=dev)
        left -= rows * width
        i += 1
    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    ticket = ct.save(sd, "gpu-bench/ckpt", client=c, durability="memory", pipelined=True, wait=False)
    blocked = time.perf_counter() - t0
    ticket.wait()
    t0 = time.perf_counter()
    torch.save(sd, tmp / "ckpt.pt")
    torch_s = time.perf_counter() - t0
    return {"params": params, "bytes": params * 4, "cairn_blocking_s": blocked, "torch_save_s": torch_s}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--emulated", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    if not a.emulated:
        try:
            import torch
        except ImportError:
            print("no GPU here (PyTorch, which this driver uses for device buffers, is not installed)")
            return 3
        if not torch.cuda.is_available():
            print("no GPU here (torch.cuda.is_available() is false)")
            return 3
    n = (32 if a.quick else 256) << 20
    models, reps = (3, 5) if a.quick else (5, 15)
    out = {"backend": "emulated" if a.emulated else "cuda"}
    with tempfile.TemporaryDirectory(prefix="cairn-gpu-bench-") as tmpdir:
        tmp = Path(tmpdir)
        p = start_daemon(tmp, out["backend"], hbm_bytes=(models + 1) * n + (64 << 20), dram_bytes=(models + 2) * n)
        try:
            c = cairn.connect(str(tmp / "cairnd.sock"))
            out.update(measure_load_and_hit(c, Device(a.emulated), n, models, reps))
            if not a.emulated:
                out["checkpoint"] = measure_checkpoint(c, 12_400_000 if a.quick else 124_000_000, tmp)
            c.close()
        finally:
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=120)
    print(json.dumps(out, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
