#!/usr/bin/env python3
"""The GPU tier against the plain CUDA ways of doing the same (goals in docs/gpu.md).

  load      a tensor into device memory on a daemon-side miss (cairn_model_read_tensor with
            CAIRN_MEM_CUDA: read into the arena if needed, DMA from the registered arena into the HBM
            pool, then device-to-device into the caller's buffer) against a plain cudaMemcpy of the
            same bytes from pinned host memory (torch copy_ from a pinned tensor). Goal: bandwidth
            ratio >= 0.9.
  module    a GPT-2-medium-shaped model (24 blocks of nn.Linear/nn.LayerNorm, width 1024, nn.Embedding
            50257 x 1024 and 1024 x 1024; bfloat16: 355 M parameters, 0.71 GB, 292 tensors; --quick:
            2 narrow blocks) stored in cairn at durability memory (DRAM-resident), loaded into a CUDA
            nn.Module built fresh for each load (on the meta device, then to_empty on cuda:0, outside
            the timing): cairn.torch.load(id, module=m, device="cuda:0", client=c) against
            safetensors.torch.load_file(path, device="cuda:0") + m.load_state_dict(sd) of a
            safetensors file of the same state (page cache warm). The first cairn load (a new
            connection, the model not yet in HBM) is reported apart from the median of the later ones
            (HBM hits). Every parameter is compared with the original after every cairn load
            (torch.equal on the GPU); a mismatch makes this driver exit 1. Goals: the later loads
            >= 10x faster than safetensors, and ahead of the fastest GPU loader below.
  loaders   the same safetensors file onto cuda:0 by the GPU loaders users pick instead, each in a
            process of its own (a loader that crashes cannot take the run down) and only where it is
            installed ({"skipped": why} otherwise): fastsafetensors (SafeTensorsFileLoader(SingleGroup(),
            "cuda:0", nogds=True), add_filenames, copy_files_to_device, get_tensor), InstantTensor
            (instanttensor.safe_open(path, framework="pt", device="cuda:0").tensors()) and Run:ai
            Model Streamer (SafetensorsStreamer().stream_file(path, device="cuda:0"), get_tensors()):
            the time until every tensor is on cuda:0 (synchronized), first and median of the later
            loads, each load checked equal to safetensors' load of the file (itself checked equal to
            the original in `module`); the row says the loader's version.
  hit       a tensor already in HBM, reached by a new reader (open, cairn_model_map_tensor_device:
            zero-copy through the slab's IPC handle) against a device-to-device copy of the same bytes
            (goal: less) and against loading it (the `load` miss; goal: < 1/100); and two client
            processes mapping one tensor at once: the device holds one copy (`cairn stats` hbm
            devices[0].entries grows by 1, not 2).
  checkpoint  GPT-2-sized weights (124M float32 parameters; --quick: 1/10) on the device: the time
            cairn.torch.save(pipelined=True, wait=False) blocks the caller against copying the same
            tensors into pinned host buffers (non_blocking, then synchronize; goal <= 1.2x) and
            against torch.save of the same state dict to a file (goal <= 1/20). The checkpoint is
            read back (cairn.torch.load to the CPU) and compared; a mismatch makes this driver exit 1.

A daemon is started with tiers.hbm on device 0 (backend cuda) and stopped by pid. --emulated runs
load and hit on the emulated backend with host buffers (no GPU needed): a check of this driver's
plumbing, not a measurement of anything a GPU does.

The JSON has a dict per part ("load", "hit", "module", "loaders", "checkpoint"; a part that raised
has {"error": ...}), the figures bench/harness.py reads (bytes, miss_s, hit_map_s, pinned_copy_s,
d2d_copy_s, checkpoint.*), and "rows": one entry per comparison with figure, baseline, ratio and goal
(the summary printed at the end).

Usage: bench/workloads/gpu_bench.py [--quick] [--emulated] [--only load,module,loaders,hit,checkpoint]
                                    [--json FILE]
Exit status 3, with the reason on stdout, when there is no GPU (bench/run reports the part as skipped);
1 when a part failed or bytes read back differ from those stored.
"""
import argparse
import ctypes
import importlib.util
import json
import os
import select
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("CAIRN_BUILD_DIR", ROOT / "build"))
sys.path.insert(0, str(ROOT / "api" / "python"))
os.environ.setdefault("CAIRN_LIBRARY", str(BUILD / "lib" / "libcairn.so"))

import numpy as np  # noqa: E402

import cairn  # noqa: E402
from cairn import _errors  # noqa: E402

MEM_CUDA = 1
PARTS = ("load", "module", "loaders", "hit", "checkpoint")
MODEL_ID = "gpu-bench/model"
# GPT-2 medium's shapes (Hugging Face's GPT2Model state dict: no tied LM head); --quick: a toy.
MODEL_FULL = {"layers": 24, "width": 1024, "vocab": 50257, "context": 1024, "dtype": "bfloat16"}
MODEL_QUICK = {"layers": 2, "width": 256, "vocab": 4096, "context": 256, "dtype": "bfloat16"}
# The GPU loaders compared in `loaders`: name -> (module to import, distribution for the version).
LOADERS = {"fastsafetensors": ("fastsafetensors", "fastsafetensors"),
           "instanttensor": ("instanttensor", "instanttensor"),
           "runai_model_streamer": ("runai_model_streamer", "runai-model-streamer")}


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


def wait_arena_backed(c, timeout: float = 60.0) -> float:
    """Waits for the daemon's background pass that backs its DRAM arena (as a daemon a job's prologue
    started has finished long before the job's first load); returns the seconds waited."""
    t0 = time.time()
    while not c.stats()["tiers"]["dram"].get("prefault_finished", True) and time.time() - t0 < timeout:
        time.sleep(0.05)
    return time.time() - t0


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


def device_sync(torch, dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def first_and_rest(times):
    """{"first_s", "median_s" (of the loads after the first), "samples_s"}."""
    rest = times[1:] or times
    return {"first_s": times[0], "median_s": statistics.median(rest), "samples_s": times}


def row(part: str, what: str, figure: float, baseline_name: str, baseline: float, unit: str, ratio_is: str,
        goal=None) -> dict:
    """One comparison for the summary: cairn's figure, the baseline's (baseline_value) and its name
    (baseline), their ratio (ratio_is: "cairn / baseline" or "baseline / cairn") and the goal on that
    ratio ("<= 0.05", ">= 10", "== 1", ...; None: reported only). name/value repeat what/figure under
    the names scripts/device_check.py reads."""
    if ratio_is == "cairn / baseline":
        r = figure / baseline if baseline else float("nan")
    else:
        r = baseline / figure if figure else float("inf")
    met = None
    if goal:
        op, val = goal.split()
        met = {"<=": r <= float(val), ">=": r >= float(val), "<": r < float(val), ">": r > float(val),
               "==": r == float(val)}[op]
    return {"part": part, "name": f"{part}: {what}", "figure": figure, "value": figure, "unit": unit,
            "baseline": baseline_name, "baseline_value": baseline, "ratio": r, "ratio_is": ratio_is, "goal": goal,
            "met": met}


# ---- load and hit ----

def hbm_entries(c, out: dict, when: str) -> int:
    """Records device 0's HBM entries and evictions so far in out; returns their sum (an eviction
    between two looks would otherwise hide an entry added meanwhile)."""
    d = c.stats()["tiers"]["hbm"]["devices"][0]
    out["entries_" + when], out["evictions_" + when] = int(d["entries"]), int(d["evictions"])
    return int(d["entries"]) + int(d["evictions"])


# Run by the second client process of the shared-map check: maps one tensor on device 0, prints the
# pointer, holds the map until a line arrives on stdin.
_HOLDER = r"""
import ctypes, sys
sys.path.insert(0, sys.argv[1])
import cairn
from cairn import _errors
c = cairn.connect(sys.argv[2])
lib = c._lib
r = ctypes.c_void_p()
ptr, n = ctypes.c_void_p(), ctypes.c_size_t()
try:
    with c._conn.op() as h:
        st = lib.cairn_model_open(h, sys.argv[3].encode(), ctypes.byref(r))
        if st != 0:
            raise _errors.last_error(st)
        st = lib.cairn_model_map_tensor_device(r, b"w", 0, ctypes.byref(ptr), ctypes.byref(n))
        if st != 0:
            raise _errors.last_error(st)
except Exception as e:
    print("ERROR", type(e).__name__, e, flush=True)
    sys.exit(1)
print("MAPPED", ptr.value, n.value, flush=True)
sys.stdin.readline()
with c._conn.op():
    lib.cairn_model_close(r)
c.close()
"""


def shared_map(c, sock: Path, n: int) -> dict:
    """Two client processes (this one and a child) hold a device map of the same tensor at once: the
    daemon's HBM entries (counting evictions) grow by one."""
    lib, conn = c._lib, c._conn
    mid = "gpu-bench/shared"
    c.save_model(mid, {"w": np.random.default_rng(2).integers(0, 255, n, dtype=np.uint8)}, durability="memory")
    out = {"bytes": n}
    before = hbm_entries(c, out, "before")
    r = ctypes.c_void_p()
    ptr, got = ctypes.c_void_p(), ctypes.c_size_t()
    with conn.op() as h:
        check(lib.cairn_model_open(h, mid.encode(), ctypes.byref(r)))
        try:
            check(lib.cairn_model_map_tensor_device(r, b"w", 0, ctypes.byref(ptr), ctypes.byref(got)))
        except BaseException:
            lib.cairn_model_close(r)
            raise
    child = None
    try:
        hbm_entries(c, out, "one_holder")
        out["ptr_here"] = ptr.value
        child = subprocess.Popen([sys.executable, "-c", _HOLDER, str(ROOT / "api" / "python"), str(sock), mid],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready, _, _ = select.select([child.stdout], [], [], 120)
        line = child.stdout.readline().strip() if ready else ""
        if not line.startswith("MAPPED"):
            child.kill()
            _, err = child.communicate(timeout=30)
            child = None
            raise RuntimeError(f"the second client did not map {mid}: {line or 'no answer in 120 s'}; "
                               f"its stderr: {err[-2000:]}")
        out["ptr_other_process"] = int(line.split()[1])
        both = hbm_entries(c, out, "two_holders")
        out["hbm_hits"] = c.stats()["tiers"]["hbm"]["hits"]
        child.stdin.write("\n")
        child.stdin.flush()
        child.wait(timeout=60)
        child = None
    finally:
        if child is not None:
            child.kill()
            child.wait()
        with conn.op():
            lib.cairn_model_close(r)
    out["copies_on_device"] = both - before
    return out


def measure_load_and_hit(c, dev: Device, n: int, models: int, reps: int, sock: Path, shared_n: int) -> dict:
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
    out = {"bytes": n, "miss_s": statistics.median(miss_s), "hit_map_s": statistics.median(hit_s),
           "pinned_copy_s": dev.baseline_load(n, reps), "d2d_copy_s": dev.baseline_d2d(n, reps),
           "hbm_hits": stats["hits"], "hbm_misses": stats["misses"],
           "miss_samples_s": miss_s, "hit_samples_s": hit_s}
    out["shared"] = shared_map(c, sock, shared_n)
    return out


def load_rows(d: dict) -> list:
    mib = d["bytes"] >> 20
    return [row("load", f"{mib} MiB tensor into device memory on an HBM miss, bandwidth",
                d["bytes"] / d["miss_s"] / 1e9, "cudaMemcpy from pinned memory", d["bytes"] / d["pinned_copy_s"] / 1e9,
                "GB/s", "cairn / baseline", ">= 0.9")]


def hit_rows(d: dict) -> list:
    mib = d["bytes"] >> 20
    s = d["shared"]
    return [row("hit", f"new reader maps a {mib} MiB tensor in HBM (open + map)", d["hit_map_s"],
                "device-to-device copy", d["d2d_copy_s"], "s", "cairn / baseline", "< 1"),
            row("hit", f"new reader maps a {mib} MiB tensor in HBM vs loading it", d["hit_map_s"],
                "load on an HBM miss", d["miss_s"], "s", "cairn / baseline", "< 0.01"),
            row("hit", f"copies on the device while 2 processes map one {s['bytes'] >> 20} MiB tensor",
                s["copies_on_device"], "one copy", 1, "entries", "cairn / baseline", "== 1")]


# ---- module: a whole model into an nn.Module on the GPU ----

def build_model(cfg: dict, device, torch):
    """GPT-2's layout from torch.nn layers (names as Hugging Face's GPT2Model: wte, wpe, h.N.ln_1,
    h.N.attn.c_attn, h.N.attn.c_proj, h.N.ln_2, h.N.mlp.c_fc, h.N.mlp.c_proj, ln_f). Only loaded here,
    never run, so it has no forward."""
    from torch import nn
    kw = {"device": device, "dtype": getattr(torch, cfg["dtype"])}
    d = cfg["width"]
    m = nn.Module()
    m.wte = nn.Embedding(cfg["vocab"], d, **kw)
    m.wpe = nn.Embedding(cfg["context"], d, **kw)
    m.h = nn.ModuleList()
    for _ in range(cfg["layers"]):
        b = nn.Module()
        b.ln_1 = nn.LayerNorm(d, **kw)
        b.attn = nn.ModuleDict({"c_attn": nn.Linear(d, 3 * d, **kw), "c_proj": nn.Linear(d, d, **kw)})
        b.ln_2 = nn.LayerNorm(d, **kw)
        b.mlp = nn.ModuleDict({"c_fc": nn.Linear(d, 4 * d, **kw), "c_proj": nn.Linear(4 * d, d, **kw)})
        m.h.append(b)
    m.ln_f = nn.LayerNorm(d, **kw)
    return m


def fresh_module(cfg: dict, dev, torch):
    """The model built on the meta device (no memory, no initialisation), then given empty storage on dev."""
    return build_model(cfg, "meta", torch).to_empty(device=dev)


def differing(state: dict, ref: dict, torch) -> list:
    """Names whose tensor is not bitwise the original (missing, extra, another dtype/shape/device or bytes)."""
    bad = sorted(set(state) ^ set(ref))
    for k, want in ref.items():
        t = state.get(k)
        if t is None:
            continue
        if t.dtype != want.dtype or t.shape != want.shape or t.device != want.device or not torch.equal(t, want):
            bad.append(k)
    return bad


class Model:
    """The reference model: its state on the GPU, a safetensors file of it, and (when stored) its id."""

    def __init__(self, cfg: dict, dev, tmp: Path, torch):
        self.cfg, self.dev, self.torch = cfg, dev, torch
        m = fresh_module(cfg, dev, torch)
        torch.manual_seed(19)
        with torch.no_grad():
            for p in m.state_dict().values():
                p.copy_(torch.randn(p.shape, device=dev) * 0.02)
        self.ref = {k: v.detach() for k, v in m.state_dict().items()}
        self.bytes = sum(t.numel() * t.element_size() for t in self.ref.values())
        self.params = sum(t.numel() for t in self.ref.values())
        self.path = tmp / "model.safetensors"
        from safetensors.torch import save_file
        t0 = time.perf_counter()
        save_file({k: v.cpu().contiguous() for k, v in self.ref.items()}, str(self.path))
        self.write_s = time.perf_counter() - t0
        self.stored = False
        self.file_checked = False  # safetensors' load of the file compared with ref

    def check_file(self, state: dict, failures: list) -> None:
        bad = differing(state, self.ref, self.torch)
        if bad:
            failures.append(f"safetensors' load of {self.path.name} differs from the original in {len(bad)} tensors "
                            f"({', '.join(bad[:5])})")
        self.file_checked = True

    def store(self, c) -> float:
        import cairn.torch as ct
        if not self.stored:
            t0 = time.perf_counter()
            ct.save({k: v.cpu() for k, v in self.ref.items()}, MODEL_ID, client=c, durability="memory")
            self.store_s = time.perf_counter() - t0
            self.stored = True
        return self.store_s

    def warm_page_cache(self) -> None:
        with open(self.path, "rb") as f:
            while f.read(64 << 20):
                pass


def measure_module(model: Model, store_client, sock: Path, reps: int, failures: list) -> dict:
    torch = model.torch
    import cairn.torch as ct
    from safetensors.torch import load_file
    import safetensors
    dev, cfg, ref = model.dev, model.cfg, model.ref
    sync = lambda: device_sync(torch, dev)  # noqa: E731
    where = str(dev)  # "cuda:0"
    out = {"model": dict(cfg, params=model.params, tensors=len(ref)), "bytes": model.bytes,
           "safetensors_version": safetensors.__version__, "torch_version": torch.__version__,
           "write_safetensors_s": model.write_s}

    # The baseline: safetensors into a fresh module, the file in the page cache.
    model.warm_page_cache()
    times, load_file_s = [], []
    for i in range(1 + reps):
        m = fresh_module(cfg, dev, torch)
        sync()
        t0 = time.perf_counter()
        sd = load_file(str(model.path), device=where)
        sync()
        t1 = time.perf_counter()
        m.load_state_dict(sd)
        sync()
        times.append(time.perf_counter() - t0)
        load_file_s.append(t1 - t0)
        if i == 0:
            model.check_file(m.state_dict(), failures)
        del m, sd
    out["safetensors"] = first_and_rest(times)
    out["safetensors"]["load_file_median_s"] = statistics.median(load_file_s[1:] or load_file_s)

    # cairn: the first load on a new connection (model not in HBM), then the later ones.
    out["store_s"] = model.store(store_client)
    times, mismatches = [], 0
    c = None
    try:
        for i in range(1 + reps):
            m = fresh_module(cfg, dev, torch)
            sync()
            t0 = time.perf_counter()
            if c is None:
                c = cairn.connect(str(sock))
            ct.load(MODEL_ID, module=m, device=where, client=c)
            sync()
            times.append(time.perf_counter() - t0)
            bad = differing(m.state_dict(), ref, torch)
            if bad:
                mismatches += 1
                failures.append(f"module: cairn load {i} differs from the original in {len(bad)} tensors "
                                f"({', '.join(bad[:5])})")
            del m
        out["cairn"] = first_and_rest(times)
        out["cairn"]["mismatched_loads"] = mismatches
        # The state dict alone: tensors that alias the daemon's HBM copies (no copy), for reference.
        sd_s = []
        for _ in range(max(1, reps // 2)):
            sync()
            t0 = time.perf_counter()
            sd = ct.load(MODEL_ID, device=where, client=c)
            sync()
            sd_s.append(time.perf_counter() - t0)
            bad = differing(sd, ref, torch)
            if bad:
                failures.append(f"module: cairn state dict on cuda:0 differs from the original in {len(bad)} "
                                f"tensors ({', '.join(bad[:5])})")
            del sd
        out["cairn"]["state_dict_median_s"] = statistics.median(sd_s)
        out["hbm"] = c.stats()["tiers"]["hbm"]["devices"][0]
    finally:
        if c is not None:
            c.close()
    return out


def module_rows(d: dict) -> list:
    cfg = d["model"]
    what = (f"{cfg['params'] / 1e6:.0f}M-parameter {cfg['dtype']} GPT-2-shaped nn.Module ({cfg['tensors']} tensors) "
            "onto cuda:0")
    return [row("module", what + ", later loads (HBM hit)", d["cairn"]["median_s"],
                "safetensors load_file + load_state_dict", d["safetensors"]["median_s"], "s", "baseline / cairn",
                ">= 10"),
            row("module", what + ", first load (new connection, HBM miss)", d["cairn"]["first_s"],
                "safetensors load_file + load_state_dict (first)", d["safetensors"]["first_s"], "s",
                "baseline / cairn")]


# ---- loaders: the GPU loaders users pick instead, each in a process of its own ----

def _load_fastsafetensors(path: str, device: str):
    # fastsafetensors' own API (fastsafetensors/loader.py, file_buffer.py): a loader per file set,
    # the files copied to device buffers, tensors instantiated from them (zero copy).
    from fastsafetensors import SafeTensorsFileLoader, SingleGroup
    loader = SafeTensorsFileLoader(SingleGroup(), device, nogds=True)
    try:
        loader.add_filenames({0: [path]})
        fb = loader.copy_files_to_device()
    except BaseException:
        loader.close()
        raise
    out = {k: fb.get_tensor(k) for k in loader.get_keys()}

    def close():  # before 0.5 the tensors were views of fb's buffers: closed only after the check
        fb.close()
        loader.close()
    return out, close


def _load_instanttensor(path: str, device: str):
    from instanttensor import safe_open
    with safe_open(path, framework="pt", device=device) as f:  # copy=True (default): tensors own memory
        out = dict(f.tensors())
    return out, lambda: None


def _load_runai_model_streamer(path: str, device: str):
    import inspect
    from runai_model_streamer import SafetensorsStreamer
    with SafetensorsStreamer() as s:
        if "device" in inspect.signature(s.stream_file).parameters:
            s.stream_file(path, device=device)
            out = dict(s.get_tensors())
        else:  # releases before device= streamed to host memory only
            s.stream_file(path)
            out = {k: t.to(device) for k, t in s.get_tensors()}
    return out, lambda: None


def loader_child(name: str, path: str, reps: int, out_path: str, device: str) -> int:
    """--_loader: one GPU loader, timed in this process; the result as JSON in out_path."""
    res: dict = {}
    try:
        import importlib.metadata
        import torch
        from safetensors.torch import load_file
        module, dist = LOADERS[name]
        try:
            __import__(module)
            load = globals()["_load_" + name]
        except Exception as e:  # installed but not importable here (a missing dependency, a CUDA mismatch)
            res = {"skipped": f"import {module} failed: {type(e).__name__}: {e}"}
            return 0
        try:
            res["version"] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            res["version"] = getattr(sys.modules[module], "__version__", "unknown")
        dev = torch.device(device)
        ref = load_file(path, device=str(dev))  # checked equal to the original by the parent
        times, mismatched = [], []
        for i in range(reps):
            device_sync(torch, dev)
            t0 = time.perf_counter()
            got, close = load(path, str(dev))
            device_sync(torch, dev)
            times.append(time.perf_counter() - t0)
            where = {str(t.device) for t in got.values()}
            bad = differing(got, ref, torch) if where == {str(dev)} else sorted(got)
            if bad:
                mismatched.append({"load": i, "tensors": len(bad), "first": bad[:5], "devices": sorted(where)})
            close()
            del got
        res.update(first_and_rest(times))
        res["equal"] = not mismatched
        if mismatched:
            res["mismatched"] = mismatched
    except Exception as e:
        res["error"] = f"{type(e).__name__}: {e}"
        res["traceback"] = traceback.format_exc()[-3000:]
    finally:
        Path(out_path).write_text(json.dumps(res, indent=1) + "\n")
    return 0


def _text(b) -> str:
    """Captured output (bytes in TimeoutExpired whatever text= said, or None) as text."""
    if b is None:
        return ""
    return b.decode(errors="replace") if isinstance(b, bytes) else b


def measure_loaders(model: Model, tmp: Path, reps: int, timeout: float, failures: list) -> dict:
    """Each loader checks its tensors against safetensors' load of the file; that load is checked
    against the original here (or was, in measure_module)."""
    if not model.file_checked:
        from safetensors.torch import load_file
        model.check_file(load_file(str(model.path), device=str(model.dev)), failures)
    out = {}
    for name, (module, _) in LOADERS.items():
        if importlib.util.find_spec(module) is None:
            out[name] = {"skipped": f"{module} is not installed"}
            continue
        res_path = tmp / f"loader-{name}.json"
        t0 = time.time()
        try:
            r = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--_loader", name, "--_file",
                                str(model.path), "--_reps", str(reps), "--_out", str(res_path), "--_device",
                                str(model.dev)],
                               capture_output=True, text=True, timeout=timeout)
            res = json.loads(res_path.read_text()) if res_path.exists() else {}
            if r.returncode != 0 or not res:
                res.setdefault("error", f"exited with {r.returncode}")
                res["output_tail"] = (r.stdout + r.stderr)[-3000:]
        except subprocess.TimeoutExpired as e:
            tail = _text(e.stdout) + _text(e.stderr)
            res = {"error": f"did not finish within {timeout:.0f} s", "output_tail": tail[-3000:]}
        res["process_s"] = time.time() - t0
        out[name] = res
    return out


def loader_rows(loaders: dict, module: dict) -> list:
    cairn_s = (module or {}).get("cairn", {}).get("median_s")
    if cairn_s is None:
        return []
    rows, fastest = [], None
    for name, d in loaders.items():
        if not isinstance(d, dict) or "median_s" not in d or not d.get("equal"):
            continue  # skipped, failed, or not a loader ("part_s")
        rows.append(row("loaders", f"model onto cuda:0: cairn (module, later loads) vs {name} {d['version']}",
                        cairn_s, f"{name} {d['version']} (all tensors on cuda:0)", d["median_s"], "s",
                        "baseline / cairn", "> 1"))
        if fastest is None or d["median_s"] < fastest[1]:
            fastest = (f"{name} {d['version']}", d["median_s"])
    if fastest is not None:
        rows.append(row("module", "model onto cuda:0, later loads: ahead of the fastest GPU loader", cairn_s,
                        f"fastest: {fastest[0]}", fastest[1], "s", "baseline / cairn", "> 1"))
    return rows


# ---- checkpoint ----

def measure_checkpoint(c, params: int, tmp: Path, reps: int, failures: list) -> dict:
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
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    # The floor: the same tensors copied into pinned host buffers (allocated beforehand).
    pinned = {k: torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for k, t in sd.items()}

    def d2h():
        for k, t in sd.items():
            pinned[k].copy_(t, non_blocking=True)
    d2h()  # warm-up
    d2h_s = median_time(d2h, reps, lambda: torch.cuda.synchronize(dev))
    pinned.clear()  # the pinned buffers go
    # The first checkpoint (this connection's first copy from the device: it page-locks the arena
    # ranges it writes), then the steady state: a training loop's later checkpoints, each after a
    # step changed the weights a little.
    blocked_all, done_all = [], []
    for i in range(reps + 1):
        if i:
            sd["h.0.w"].add_(1.0)
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        ticket = ct.save(sd, f"gpu-bench/ckpt-{i}", client=c, durability="memory", pipelined=True, wait=False)
        blocked_all.append(time.perf_counter() - t0)
        ticket.wait()
        done_all.append(time.perf_counter() - t0)
    blocked, done = statistics.median(blocked_all[1:]), statistics.median(done_all[1:])
    t0 = time.perf_counter()
    torch.save(sd, tmp / "ckpt.pt")
    torch_s = time.perf_counter() - t0
    (tmp / "ckpt.pt").unlink()
    back = ct.load(f"gpu-bench/ckpt-{reps}", client=c)  # CPU tensors over the daemon's arena
    bad = sorted(set(back) ^ set(sd)) + [k for k, t in sd.items() if k in back and not torch.equal(back[k], t.cpu())]
    del back
    if bad:
        failures.append(f"checkpoint: {len(bad)} tensors read back differ from those saved ({', '.join(bad[:5])})")
    return {"params": params, "bytes": nbytes, "tensors": len(sd), "cairn_blocking_s": blocked,
            "cairn_first_blocking_s": blocked_all[0], "cairn_blocking_samples_s": blocked_all,
            "cairn_memory_durable_s": done, "d2h_pinned_s": d2h_s, "torch_save_s": torch_s, "verified": not bad}


def checkpoint_rows(k: dict) -> list:
    what = f"checkpoint of {k['params'] / 1e6:.0f}M float32 parameters on the device: time the caller blocks"
    return [row("checkpoint", what, k["cairn_blocking_s"], "device-to-host copy into pinned buffers",
                k["d2h_pinned_s"], "s", "cairn / baseline", "<= 1.2"),
            row("checkpoint", what, k["cairn_blocking_s"], "torch.save", k["torch_save_s"], "s", "cairn / baseline",
                "<= 0.05"),
            row("checkpoint", what.replace("the caller blocks", "the first checkpoint blocks (pins arena ranges)"),
                k["cairn_first_blocking_s"], "device-to-host copy into pinned buffers", k["d2h_pinned_s"], "s",
                "cairn / baseline", "<= 1.2")]


# ---- driver ----

def summary(out: dict) -> str:
    lines = [f"{'part':<10} {'what':<78} {'cairn':>10} {'baseline':>10} {'unit':<7} {'ratio':>8}  {'goal':<8} met  "
             "baseline (ratio)"]
    for r in out["rows"]:
        met = {True: "yes", False: "NO", None: "-"}[r["met"]]
        what = r["name"][len(r["part"]) + 2:]
        what = what if len(what) <= 78 else what[:75] + "..."
        lines.append(f"{r['part']:<10} {what:<78} {r['figure']:>10.4g} {r['baseline_value']:>10.4g} {r['unit']:<7} "
                     f"{r['ratio']:>8.3g}  {r['goal'] or '-':<8} {met:<4} {r['baseline']} ({r['ratio_is']})")
    for part in PARTS:
        d = out.get(part)
        if isinstance(d, dict) and ("error" in d or "skipped" in d):
            lines.append(f"{part}: {d.get('error') or 'skipped: ' + d['skipped']}")
    for name, d in (out.get("loaders") or {}).items():
        if isinstance(d, dict) and ("skipped" in d or "error" in d or d.get("equal") is False):
            why = d.get("skipped") or d.get("error") or "tensors differ from the file's"
            lines.append(f"loaders: {name}: {'skipped' if 'skipped' in d else 'not compared'}: {why}")
    for f in out.get("failures", []):
        lines.append(f"FAILED: {f}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--emulated", action="store_true")
    ap.add_argument("--only", default=",".join(PARTS), help="comma-separated parts: " + ",".join(PARTS))
    ap.add_argument("--json")
    ap.add_argument("--_loader", help=argparse.SUPPRESS)
    ap.add_argument("--_file", help=argparse.SUPPRESS)
    ap.add_argument("--_reps", type=int, default=3, help=argparse.SUPPRESS)
    ap.add_argument("--_out", help=argparse.SUPPRESS)
    ap.add_argument("--_device", default="cuda:0", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a._loader:
        return loader_child(a._loader, a._file, a._reps, a._out, a._device)
    only = [p.strip() for p in a.only.split(",") if p.strip()]
    unknown = [p for p in only if p not in PARTS]
    if unknown or not only:
        ap.error(f"--only: unknown part(s) {', '.join(unknown) or '(none given)'}; the parts are {', '.join(PARTS)}")
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
    shared_n = (4 if a.quick else 64) << 20
    models, reps = (3, 5) if a.quick else (5, 15)
    module_reps, loader_reps, ckpt_reps = (2, 2, 2) if a.quick else (5, 4, 3)
    ckpt_params = 12_400_000 if a.quick else 124_000_000
    cfg = MODEL_QUICK if a.quick else MODEL_FULL
    out: dict = {"backend": "emulated" if a.emulated else "cuda", "parts": only, "quick": a.quick, "rows": [],
                 "failures": []}
    failures = out["failures"]
    if a.emulated:
        for p in only:
            if p not in ("load", "hit"):
                out[p] = {"skipped": "--emulated runs load and hit only"}
        only = [p for p in only if p in ("load", "hit")]

    # Capacities: what the parts store, twice over in DRAM (the demoter then has no reason to drop
    # anything a part reads back) and with room in HBM (its pool is carved from slabs of up to 1 GiB).
    model_bytes = 0
    if not a.emulated and ("module" in only or "loaders" in only):
        d = cfg["width"]
        params = cfg["layers"] * (12 * d * d + 13 * d) + (cfg["vocab"] + cfg["context"]) * d + 2 * d
        model_bytes = params * (2 if cfg["dtype"] in ("bfloat16", "float16") else 4)
    ckpt_bytes = 4 * ckpt_params if "checkpoint" in only else 0
    lh_bytes = models * n + shared_n if ("load" in only or "hit" in only) else 0
    if a.emulated:  # host memory: keep it small
        hbm_bytes = lh_bytes + n + (64 << 20)
        dram_bytes = 2 * lh_bytes + (256 << 20)
    else:
        hbm_bytes = lh_bytes + n + 2 * model_bytes + (1 << 30)
        dram_bytes = 2 * (lh_bytes + model_bytes + 2 * ckpt_bytes) + (1 << 30)
    if hbm_bytes > 1 << 30:  # the pool takes whole slabs of 1 GiB: a capacity's remainder is never used
        hbm_bytes = -(-hbm_bytes // (1 << 30)) << 30

    def save_json():
        if a.json:
            Path(a.json).write_text(json.dumps(out, indent=1) + "\n")

    def part(name, fn, rows_of):
        """Runs one part; an exception is recorded (and fails the run) without stopping the others."""
        t0 = time.time()
        try:
            d = fn()
            d["part_s"] = time.time() - t0
            out[name] = d
            out["rows"].extend(rows_of(d))
        except Exception as e:
            out[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:],
                         "part_s": time.time() - t0}
            failures.append(f"{name}: {type(e).__name__}: {e}")
        save_json()
        return out.get(name)

    t_start = time.time()
    with tempfile.TemporaryDirectory(prefix="cairn-gpu-bench-") as tmpdir:
        tmp = Path(tmpdir)
        sock = tmp / "cairnd.sock"
        p = start_daemon(tmp, out["backend"], hbm_bytes=hbm_bytes, dram_bytes=dram_bytes)
        try:
            c = cairn.connect(str(sock))
            out["daemon"] = {"hbm_capacity": hbm_bytes, "dram_capacity": dram_bytes,
                             "start_s": time.time() - t_start, "arena_backed_wait_s": wait_arena_backed(c)}
            if "load" in only or "hit" in only:
                lh = part("load_hit", lambda: measure_load_and_hit(c, Device(a.emulated), n, models, reps, sock,
                                                                   shared_n), lambda d: [])
                if "error" in lh:
                    for p_ in ("load", "hit"):
                        if p_ in only:
                            out[p_] = lh
                else:
                    # The figures bench/harness.py reads stay at the top level.
                    out.update({k: lh[k] for k in ("bytes", "miss_s", "hit_map_s", "pinned_copy_s", "d2d_copy_s",
                                                   "hbm_hits", "hbm_misses")})
                    if "load" in only:
                        out["load"] = {k: lh[k] for k in ("bytes", "miss_s", "pinned_copy_s", "miss_samples_s")}
                        out["rows"].extend(load_rows(lh))
                    if "hit" in only:
                        out["hit"] = {k: lh[k] for k in ("bytes", "hit_map_s", "d2d_copy_s", "miss_s", "hit_samples_s",
                                                         "hbm_hits", "hbm_misses", "shared")}
                        out["rows"].extend(hit_rows(lh))
                out.pop("load_hit", None)
                save_json()
            model = None
            if "module" in only or "loaders" in only:
                import torch
                try:
                    model = Model(cfg, torch.device("cuda", 0), tmp, torch)
                except Exception as e:
                    for p_ in ("module", "loaders"):
                        if p_ in only:
                            out[p_] = {"error": f"building the model failed: {type(e).__name__}: {e}",
                                       "traceback": traceback.format_exc()[-4000:]}
                    failures.append(f"model: {type(e).__name__}: {e}")
            if model is not None and "module" in only:
                part("module", lambda: measure_module(model, c, sock, module_reps, failures), module_rows)
            if model is not None and "loaders" in only:
                part("loaders", lambda: measure_loaders(model, tmp, loader_reps, 30 if a.quick else 40, failures),
                     lambda d: loader_rows(d, out.get("module")))
            if "checkpoint" in only:
                part("checkpoint", lambda: measure_checkpoint(c, ckpt_params, tmp, ckpt_reps, failures),
                     checkpoint_rows)
            c.close()
        finally:
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=120)
    out["total_s"] = time.time() - t_start
    print(json.dumps(out, indent=1))
    save_json()
    print(summary(out))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
