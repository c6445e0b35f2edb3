#!/usr/bin/env python3
"""The workload driver: runs the workloads described in bench/workloads/specs/*.json for cairn and
for the baselines users run today, on the same data, in the same run, and writes the ratios.

    .venv/bin/python bench/workloads/workloads.py [--quick] [--only nas,ensemble,...] --out DIR

Workloads (one spec file each; "full" and "quick" parameter sets):
  nas         regularized evolution over ResNet-50 / ViT-B/16 families; every candidate loads the
              layers of its best stored ancestor (cairn: best_ancestor + load_model of those tensors;
              baselines: the ancestor's whole file), "trains" (new random values for every tensor
              not transferred) and stores itself (cairn: save_model(parent=, inherit=); baselines:
              one file per model). Storage, store and load time per candidate.
  load        warm and cold loads of ResNet-50, ViT-B/16, BERT-base and GPT-2 small state dicts.
  ensemble    N processes load the same base model at once (cold node), change the head, store.
  checkpoint  a training loop checkpointing GPT-2 small every k steps; blocking time per checkpoint.
  coupled     a C producer puts tensors that a C consumer polls and reads (cairn C API vs Redis via
              hiredis, as SmartRedis does); throughput and per-step latency; memcpy as the limit.

Baselines: torch.save/torch.load (weights_only), safetensors save_file/load_file (torch), h5py (one
group per layer, a dataset per weight: Keras' layout, EvoStore's baseline), Redis (redis-server
started here, tensors as values), and the physical limits (memcpy, plain sequential read,
write+fsync of the same bytes). Every file baseline is written with fsync, as cairn's durable commits
are. Cold runs drop the page cache (/proc/sys/vm/drop_caches as root, else posix_fadvise DONTNEED on
the files; each row's note says which).

The driver starts its own cairnd (one per workload, fresh repository, in a temporary directory) and
redis-server, and stops them by pid. An exception in one workload becomes an error row and the others
still run. Exit status: 0, or 1 when data loaded back differed from what was stored (a correctness
failure). Timings never fail the run; where cairn loses, the table says so.

Output: DIR/workloads.json
  {"machine": {...}, "quick": bool, "rows": [{workload, metric, system, value, unit, better,
   repeats, note}], "ratios": [{workload, metric, cairn, baseline, baseline_value, ratio, goal, met}]}
and a table of the ratios on stdout.
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import json
import multiprocessing as mp
import os
import platform
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
import zlib
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BUILD = Path(os.environ.get("CAIRN_BUILD_DIR", ROOT / "build"))
sys.path.insert(0, str(ROOT / "api" / "python"))
sys.path.insert(0, str(HERE))
os.environ.setdefault("CAIRN_LIBRARY", str(BUILD / "lib" / "libcairn.so"))

import numpy as np  # noqa: E402

warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
warnings.filterwarnings("ignore", message="The given buffer is not writable")

SPECS = HERE / "specs"
ORDER = ("nas", "load", "ensemble", "checkpoint", "coupled")


class CorrectnessError(Exception):
    """Data read back differ from what was stored."""


# ---------------------------------------------------------------------------------------------
# helpers

def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def now() -> float:
    return time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of the node


def digest(a: Any) -> str:
    """A content digest of one tensor (numpy array or torch tensor)."""
    if not isinstance(a, np.ndarray):
        a = a.numpy() if hasattr(a, "numpy") and not isinstance(a, np.generic) else np.asarray(a)
    a = np.ascontiguousarray(a)
    h = hashlib.blake2b(digest_size=16)
    h.update(str(a.dtype).encode() + str(a.shape).encode())
    h.update(memoryview(a.reshape(-1).view(np.uint8)))
    return h.hexdigest()


def digests(state: Dict[str, Any]) -> Dict[str, str]:
    return {k: digest(v) for k, v in state.items()}


def check_same(what: str, got: Dict[str, Any], want: Dict[str, str], names: Optional[Sequence[str]] = None) -> None:
    names = list(want) if names is None else list(names)
    missing = [n for n in names if n not in got]
    if missing:
        raise CorrectnessError(f"{what}: tensors missing: {missing[:3]}")
    bad = [n for n in names if digest(got[n]) != want[n]]
    if bad:
        raise CorrectnessError(f"{what}: {len(bad)} tensor(s) differ from what was stored, e.g. {bad[:3]}")


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def drop_caches(files: Sequence[Path]) -> str:
    """Drops the page cache; returns how ("drop_caches" or "fadvise(DONTNEED)")."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        for p in files:
            for q in ([p] if Path(p).is_file() else [x for x in Path(p).rglob("*") if x.is_file()]):
                try:
                    fd = os.open(q, os.O_RDONLY)
                except OSError:
                    continue
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
        return "fadvise(DONTNEED) on the files (not root: drop_caches refused)"


def fs_type(path: Path) -> str:
    best, kind = "", "?"
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and str(path).startswith(parts[1]) and len(parts[1]) > len(best):
                best, kind = parts[1], f"{parts[2]} ({parts[0]} on {parts[1]})"
    except OSError:
        pass
    return kind


def machine_info(tmp: Path) -> Dict[str, Any]:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    except OSError:
        pass
    info = {"cpu": cpu, "cores": os.cpu_count(), "memory_bytes": mem, "tmp_dir": str(tmp), "tmp_fs": fs_type(tmp),
            "kernel": platform.release(), "host": socket.gethostname(), "python": platform.python_version(),
            "root": os.geteuid() == 0, "date": time.strftime("%Y-%m-%d %H:%M:%S %z")}
    for mod in ("torch", "safetensors", "h5py", "numpy"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            info[mod] = None
    try:
        info["redis_server"] = subprocess.run(["redis-server", "--version"], capture_output=True, text=True,
                                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        info["redis_server"] = None
    return info


# ---------------------------------------------------------------------------------------------
# servers

def wait_for_socket(path: str, proc: subprocess.Popen, what: str, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise RuntimeError(f"{what} exited at start (status {proc.returncode}): {err.strip()[-2000:]}")
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            s.close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"{what} did not open {path} within {timeout:.0f} s")


class Cairnd:
    """One cairnd with its own socket, repository and config under `root`; stopped by pid."""

    def __init__(self, root: Path, dram: str, nvme: Optional[str] = None, trace: Optional[Path] = None) -> None:
        """trace: record the daemon's chunk-level trace there (policy.trace, with the hint-aware
        eviction order); each start truncates it."""
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.socket = str(root / "cairnd.sock")
        self.repo = root / "repo"
        self.config = root / "cairn.yaml"
        text = (f"socket: {self.socket}\nrepository: {self.repo}\ntiers:\n  dram:\n    capacity: {dram}\n")
        if nvme:
            text += f"  nvme:\n    path: {root / 'nvme'}\n    capacity: {nvme}\n"
        if trace:
            text += f"policy:\n  eviction: hints\n  trace: {trace}\n"
        text += f"log:\n  level: warn\n  file: {root / 'cairnd.log'}\n"
        self.config.write_text(text)
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> "Cairnd":
        self.proc = subprocess.Popen([str(BUILD / "bin" / "cairnd"), "--config", str(self.config)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_for_socket(self.socket, self.proc, "cairnd")
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=300)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def connect(self):
        import cairn
        return cairn.connect(self.socket)

    def wait_backed(self) -> float:
        """bench_daemon.wait_arena_backed: as a daemon started by the job's prologue would be."""
        from bench_daemon import wait_arena_backed
        return wait_arena_backed(self.socket)


class RedisServer:
    """redis-server on a Unix socket, no persistence (as a cache for tensors is configured)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.socket = str(root / "redis.sock")
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> "RedisServer":
        exe = shutil.which("redis-server")
        if not exe:
            raise RuntimeError("redis-server not found (Debian: apt-get install redis-server)")
        self.proc = subprocess.Popen([exe, "--port", "0", "--unixsocket", self.socket, "--unixsocketperm", "700",
                                      "--save", "", "--appendonly", "no", "--dir", str(self.root),
                                      "--protected-mode", "no", "--proto-max-bulk-len", "2gb",
                                      "--loglevel", "warning", "--logfile", str(self.root / "redis.log")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_for_socket(self.socket, self.proc, "redis-server")
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


class Resp:
    """A minimal RESP2 client over a Unix socket (redis-py is not installed here): pipelined
    commands, bulk replies read straight into bytearrays."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.rf = self.sock.makefile("rb", buffering=1 << 20)

    def close(self) -> None:
        self.rf.close()
        self.sock.close()

    def send(self, *args: Any) -> None:
        head = [b"*%d\r\n" % len(args)]
        for a in args:
            if isinstance(a, str):
                a = a.encode()
            mv = memoryview(a).cast("B") if not isinstance(a, (bytes, bytearray)) else a
            head.append(b"$%d\r\n" % len(mv))
            if len(mv) > 65536:
                self.sock.sendall(b"".join(head))
                self.sock.sendall(mv)
                head = [b"\r\n"]
            else:
                head.append(bytes(mv) + b"\r\n")
        self.sock.sendall(b"".join(head))

    def reply(self) -> Any:
        line = self.rf.readline()
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(f"redis: {rest.decode()}")
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            buf = bytearray(n)
            mv, got = memoryview(buf), 0
            while got < n:
                k = self.rf.readinto(mv[got:])
                if not k:
                    raise RuntimeError("redis: connection closed")
                got += k
            self.rf.read(2)
            return buf
        if kind == b"*":
            return [self.reply() for _ in range(int(rest))]
        raise RuntimeError(f"redis: unexpected reply {line[:40]!r}")

    def call(self, *args: Any) -> Any:
        self.send(*args)
        return self.reply()


# ---------------------------------------------------------------------------------------------
# file baselines (torch tensors share memory with the numpy arrays: no copy on the way in)

def to_torch(state: Dict[str, np.ndarray]):
    import torch
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}


def save_torch(state: Dict[str, np.ndarray], path: Path) -> None:
    import torch
    with open(path, "wb") as f:
        torch.save(to_torch(state), f)
        f.flush()
        os.fsync(f.fileno())


def load_torch(path: Path):
    import torch
    return torch.load(path, map_location="cpu", weights_only=True)


def save_safetensors(state: Dict[str, np.ndarray], path: Path) -> None:
    from safetensors.torch import save_file
    save_file(to_torch(state), str(path))
    fsync_path(path)


def load_safetensors(path: Path):
    from safetensors.torch import load_file
    return load_file(str(path))


def _h5_split(name: str) -> Tuple[str, str]:
    layer, _, weight = name.rpartition(".")
    return (layer or "_"), weight


def save_h5(state: Dict[str, np.ndarray], path: Path) -> None:
    """Keras' weights layout: one group per layer, one dataset per weight (EvoStore's baseline)."""
    import h5py
    with h5py.File(path, "w") as f:
        names = []
        for k, v in state.items():
            layer, weight = _h5_split(k)
            g = f.require_group(layer)
            g.create_dataset(weight, data=v)
            names.append(k)
        f.attrs["tensor_names"] = json.dumps(names)
    fsync_path(path)


def load_h5(path: Path) -> Dict[str, np.ndarray]:
    import h5py
    out = {}
    with h5py.File(path, "r") as f:
        for k in json.loads(f.attrs["tensor_names"]):
            layer, weight = _h5_split(k)
            out[k] = np.asarray(f[layer][weight][()])
    return out


FILE_BASELINES = {
    "torch.save": (".pt", save_torch, load_torch),
    "safetensors": (".safetensors", save_safetensors, load_safetensors),
    "h5py": (".h5", save_h5, load_h5),
}


def redis_store(r: Resp, model: str, state: Dict[str, np.ndarray]) -> None:
    header = {k: [str(v.dtype), list(v.shape)] for k, v in state.items()}
    r.send("SET", f"{model}/__header__", json.dumps(header))
    n = 1
    for k, v in state.items():
        r.send("SET", f"{model}/{k}", np.ascontiguousarray(v).reshape(-1).view(np.uint8))
        n += 1
    for _ in range(n):
        r.reply()


def redis_load(r: Resp, model: str) -> Dict[str, np.ndarray]:
    header = json.loads(r.call("GET", f"{model}/__header__"))
    for k in header:
        r.send("GET", f"{model}/{k}")
    out = {}
    for k, (dt, shape) in header.items():
        out[k] = np.frombuffer(r.reply(), dtype=dt).reshape(shape)
    return out


def baselines(spec: Dict[str, Any]) -> Dict[str, Tuple[str, Callable, Callable]]:
    """The file baselines a workload runs: the spec's "baselines" (a list of names) or all of them.
    The trace parameter sets run none: they record cairn's own accesses (--trace)."""
    names = spec.get("baselines")
    return dict(FILE_BASELINES) if names is None else {n: FILE_BASELINES[n] for n in names}


def touch(state: Dict[str, Any]) -> None:
    """Reads one byte of every page (fault in what a lazy loader mapped)."""
    for v in state.values():
        a = v if isinstance(v, np.ndarray) else v.numpy()
        if a.size:
            int(a.reshape(-1).view(np.uint8)[::4096].sum())


# ---------------------------------------------------------------------------------------------
# results

class Results:
    def __init__(self) -> None:
        self.rows: List[Dict[str, Any]] = []
        self.goals: List[Tuple[str, str, str, str, str]] = []  # workload, metric, cairn system, baseline, goal
        self.correctness_failures: List[str] = []

    def add(self, workload: str, metric: str, system: str, repeats: Sequence[float], unit: str, better: str,
            note: str = "", value: Optional[float] = None) -> float:
        reps = [float(x) for x in repeats]
        v = float(value) if value is not None else (median(reps) if reps else float("nan"))
        self.rows.append({"workload": workload, "metric": metric, "system": system, "value": v, "unit": unit,
                          "better": better, "repeats": reps, "note": note})
        return v

    def goal(self, workload: str, metric: str, baseline: str, goal: str, cairn_system: str = "cairn") -> None:
        self.goals.append((workload, metric, cairn_system, baseline, goal))

    def error(self, workload: str, err: BaseException, correctness: bool) -> None:
        text = f"{type(err).__name__}: {err}"
        self.rows.append({"workload": workload, "metric": "error", "system": "-", "value": 0.0, "unit": "",
                          "better": "lower", "repeats": [], "error": text, "correctness": correctness,
                          "note": text + ("" if correctness else "\n" + traceback.format_exc()[-3000:])})
        if correctness:
            self.correctness_failures.append(f"{workload}: {text}")

    def ratios(self) -> List[Dict[str, Any]]:
        goal_of = {(w, m, c, b): g for w, m, c, b, g in self.goals}
        by_key: Dict[Tuple[str, str], Dict[str, Dict[str, Any]]] = {}
        for r in self.rows:
            if r["metric"] != "error":
                by_key.setdefault((r["workload"], r["metric"]), {})[r["system"]] = r
        out = []
        for (w, m), systems in by_key.items():
            for csys in [s for s in systems if s.startswith("cairn")]:
                c = systems[csys]
                for bsys, b in systems.items():
                    if bsys.startswith("cairn") or not b["value"] or c["value"] != c["value"]:
                        continue
                    g = goal_of.get((w, m, csys, bsys))
                    ratio = c["value"] / b["value"]
                    met = None
                    if g:
                        op, x = g.split()
                        met = ratio <= float(x) if op == "<=" else ratio >= float(x)
                    out.append({"workload": w, "metric": m if csys == "cairn" else f"{m} [{csys}]", "cairn": c["value"],
                                "baseline": bsys, "baseline_value": b["value"], "ratio": ratio, "goal": g,
                                "met": met, "unit": c["unit"], "better": c["better"]})
        return out


def fmt(v: float, unit: str) -> str:
    if unit == "bytes":
        return f"{v / 2**20:,.1f} MiB"
    if unit == "s":
        return f"{v * 1e3:,.2f} ms" if v < 10 else f"{v:,.2f} s"
    return f"{v:,.3g} {unit}"


def print_table(ratios: List[Dict[str, Any]], rows: List[Dict[str, Any]]) -> None:
    print("\nratios cairn / baseline (medians; for 'higher' metrics >1 means cairn is better, for 'lower' <1)")
    hdr = f"{'workload':10} {'metric':44} {'baseline':14} {'cairn':>13} {'baseline':>13} {'ratio':>8}  goal"
    print(hdr)
    print("-" * len(hdr))
    for r in ratios:
        goal = ""
        if r["goal"]:
            goal = f"{r['goal']:8} {'met' if r['met'] else 'NOT MET'}"
        print(f"{r['workload']:10} {r['metric'][:44]:44} {r['baseline'][:14]:14} {fmt(r['cairn'], r['unit']):>13} "
              f"{fmt(r['baseline_value'], r['unit']):>13} {r['ratio']:8.3f}  {goal}")
    errs = [r for r in rows if r["metric"] == "error"]
    for e in errs:
        print(f"ERROR in {e['workload']}: {e['error']}")
    skipped = [r for r in rows if r["metric"] == "skipped"]
    for s in skipped:
        print(f"skipped in {s['workload']}: {s['note']}")


# ---------------------------------------------------------------------------------------------
# workload: nas

def run_nas(spec: Dict[str, Any], ctx: "Context") -> None:
    B = baselines(spec)
    import cairn.torch as ct
    import models as M

    W = "nas"
    for search in spec["searches"]:
        fam = search["family"]
        tag = f"({fam})"
        root = ctx.tmp / f"nas-{fam}"
        d = Cairnd(root / "cairn", spec.get("dram", "4GiB"),
                   trace=ctx.trace("nas" if len(spec["searches"]) == 1 else f"nas-{fam}")).start()
        files_dir = root / "files"
        files_dir.mkdir(parents=True, exist_ok=True)
        try:
            c = d.connect()
            rng = random.Random(search.get("seed", 0))
            choices = search["choices"]
            ngenes = M.family_genes(fam)
            alive: List[Tuple[str, Tuple, float]] = []
            records: Dict[str, Dict[str, str]] = {}  # model -> tensor -> digest
            t_store = {s: [] for s in ["cairn", *B]}
            t_load = {s: [] for s in ["cairn", *B]}
            t_query: List[float] = []
            file_bytes = {s: 0 for s in B}
            logical = transferred_bytes = 0
            ancestors_found = 0
            total = search["population"] + search["cycles"]
            # Candidates planned ahead of the one being trained, as an asynchronous search with
            # lookahead + 1 workers (or a task queue) does: a candidate's tournament draws from the
            # models completed when it is planned, and the driver tells cairn then which tensors it
            # will load (a will_load scoped to those tensors, `when` from the mean candidate time).
            lookahead = int(search.get("lookahead", 0))
            pending: collections.deque = collections.deque()
            durations: List[float] = []

            def plan(k: int) -> Dict[str, Any]:
                mid = f"{fam}/c{k:03d}"
                if k < search["population"]:
                    genome = tuple(rng.choice(choices) for _ in range(ngenes))
                else:
                    sample = rng.sample(alive, min(search["sample"], len(alive)))
                    parent = max(sample, key=lambda a: a[2])
                    genes = list(parent[1])
                    for _ in range(rng.randint(1, search.get("max_genes_per_mutation", 1))):
                        i = rng.randrange(ngenes)
                        genes[i] = rng.choice([x for x in choices if x != genes[i]])
                    genome = tuple(genes)
                module = M.family_module(fam, genome)
                lay = M.layout_of(module)
                arch = ct.architecture(module)
                del module
                # cairn: ask the catalog for the best ancestor, load exactly the matching tensors.
                t0 = now()
                q = c.best_ancestor(arch)
                query_s = now() - t0
                t_query.append(query_s)
                anc = q.get("model")
                mapping: Dict[str, str] = {}  # new name -> stored name
                if anc:
                    for ent in q.get("tensors", []):
                        frm, layer = ent["from"], ent["layer"]
                        for s in ent["tensors"]:
                            new = layer + s[len(frm):] if s.startswith(frm + ".") else (layer if s == frm else None)
                            if new in lay:
                                mapping[new] = s
                if mapping:
                    # The driver knows what the candidate will load: exactly these tensors.
                    hint: Dict[str, Any] = {"tensors": sorted(set(mapping.values()))}
                    ahead = len(pending)
                    if ahead and durations:
                        hint["when"] = round(ahead * sum(durations) / len(durations), 3)
                    c.hint("will_load", [anc], **hint)
                return {"mid": mid, "genome": genome, "lay": lay, "arch": arch, "anc": anc, "mapping": mapping,
                        "query_s": query_s}

            planned = 0
            for k in range(total):
                while planned < total and planned <= k + lookahead:
                    pending.append(plan(planned))
                    planned += 1
                cand = pending.popleft()
                t_cand = now()
                mid, genome, lay, arch = cand["mid"], cand["genome"], cand["lay"], cand["arch"]
                anc, mapping = cand["anc"], cand["mapping"]
                t0 = now()
                loaded: Dict[str, np.ndarray] = {}
                if mapping:
                    loaded = c.load_model(anc, names=list(mapping.values()))
                    t_load["cairn"].append(now() - t0 + cand["query_s"])
                    ancestors_found += 1
                    check_same(f"nas: cairn load of {anc}", loaded, records[anc], list(mapping.values()))
                    # Baselines load the ancestor's whole file, then take the same tensors.
                    for s, (ext, _, load) in B.items():
                        t1 = now()
                        got = load(files_dir / f"{anc.replace('/', '_')}{ext}")
                        t_load[s].append(now() - t1)
                        check_same(f"nas: {s} load of {anc}", got, records[anc], list(mapping.values()))
                        del got
                # "Train": every tensor not transferred gets new values.
                new_names = [n for n in lay if n not in mapping]
                fresh = M.random_state(lay, seed=zlib.crc32(f"{fam}/{k}".encode()), names=new_names)
                # The module's own copies of the transferred tensors (what load_state_dict makes).
                state = {n: (np.array(loaded[mapping[n]]) if n in mapping else fresh[n]) for n in lay}
                rec = {n: (records[anc][mapping[n]] if n in mapping else digest(fresh[n])) for n in lay}
                score = 0.7 + 0.05 * rng.random()
                inherit = [n for n in lay if n in mapping and mapping[n] == n]
                sent = {n: state[n] for n in lay if n not in inherit}
                # The candidate joins the population (and the oldest dies) once it is scored. The
                # driver says so before storing it, with every member's score and the tournament
                # size: cairn weighs the candidate's chunks by its chance to be the next parent as
                # they are written, not after they have gone by.
                alive.append((mid, genome, score))
                if len(alive) > search["population"]:
                    dead = alive.pop(0)
                    c.hint("done", [dead[0]])  # the oldest dies: never a parent again
                if len(alive) == search["population"]:
                    c.hint("population", [a[0] for a in alive], scores=[a[2] for a in alive],
                           tournament=search["sample"])
                t0 = now()
                c.save_model(mid, sent, parent=anc, arch=arch, meta={"score": score}, inherit=inherit,
                             order=list(lay), wait=True)
                t_store["cairn"].append(now() - t0)
                for s, (ext, save, _) in B.items():
                    p = files_dir / f"{mid.replace('/', '_')}{ext}"
                    t0 = now()
                    save(state, p)
                    t_store[s].append(now() - t0)
                    file_bytes[s] += p.stat().st_size
                del loaded, state, sent, fresh
                records[mid] = rec
                nb = M.nbytes(lay)
                logical += nb
                transferred_bytes += sum(int(np.prod(lay[n][0], dtype=np.int64)) * lay[n][1].itemsize for n in mapping)
                durations.append(now() - t_cand)
                if ctx.verbose:
                    print(f"  nas {mid}: ancestor {anc} transferred {len(mapping)}/{len(lay)} tensors", flush=True)
            c.flush()
            # Read back a few models whole and compare with what was stored (the driver says so first:
            # some of them were hinted done when they died). Every ancestor load above was compared
            # already; a trace parameter set leaves this out ("readback": false) so that the recorded
            # trace is the search's own reads, not the benchmark's check.
            readback = list(records)[:: max(1, len(records) // 3)] + [list(records)[-1]]
            if not spec.get("readback", True):
                readback = []
            elif readback:
                c.hint("sequence", readback, ahead=1)
            for mid in readback:
                check_same(f"nas: cairn load of {mid}", c.load_model(mid, copy=True), records[mid])
            st = c.stats()
            physical = st["repository"]["physical_bytes"]
            n = len(records)
            note_c = (f"{n} candidates (population {search['population']}, tournaments of {search['sample']}); "
                      f"repository physical_bytes after flush; {ancestors_found} loaded from an ancestor; "
                      f"{transferred_bytes / max(1, logical):.0%} of the candidates' bytes were transferred layers")
            ctx.res.add(W, f"storage bytes {tag}", "cairn", [physical], "bytes", "lower", note_c)
            for s in B:
                ctx.res.add(W, f"storage bytes {tag}", s, [file_bytes[s]], "bytes", "lower",
                            f"one file per model, {n} files")
                ctx.res.goal(W, f"storage bytes {tag}", s, "<= 0.2")
            ctx.res.add(W, f"logical bytes {tag}", "info", [logical], "bytes", "lower",
                        "sum of the candidates' tensor bytes (information)")
            ctx.res.add(W, f"store s per candidate {tag}", "cairn", t_store["cairn"], "s", "lower",
                        "save_model(parent=best ancestor, inherit=transferred), durability global (waited)")
            for s in B:
                ctx.res.add(W, f"store s per candidate {tag}", s, t_store[s], "s", "lower",
                            "whole model to one file + fsync")
            if t_load["cairn"]:
                ctx.res.add(W, f"load s per candidate {tag}", "cairn", t_load["cairn"], "s", "lower",
                            "best_ancestor query + load_model(names=matching tensors), zero-copy; warm")
                for s in B:
                    ctx.res.add(W, f"load s per candidate {tag}", s, t_load[s], "s", "lower",
                                "the ancestor's whole file (page cache warm)")
            ctx.res.add(W, f"best_ancestor query s {tag}", "info", t_query, "s", "lower", "catalog query alone")
            c.close()
        finally:
            d.stop()
            shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# workload: load

def run_load(spec: Dict[str, Any], ctx: "Context") -> None:
    import torch
    import cairn.torch as ct
    import models as M

    W = "load"
    root = ctx.tmp / "load"
    d = Cairnd(root / "cairn", spec.get("dram", "4GiB")).start()
    rs = RedisServer(root / "redis")
    redis_ok = True
    try:
        rs.start()
    except Exception as e:  # noqa: BLE001
        redis_ok = False
        ctx.res.add(W, "skipped", "redis", [], "", "lower", f"redis baseline skipped: {e}")
    files = root / "files"
    files.mkdir(parents=True, exist_ok=True)
    reps = spec["repeats"]
    try:
        c = d.connect()
        r = Resp(rs.socket) if redis_ok else None
        for name in spec["models"]:
            lay = M.layout(name)
            # A seed per model: with one seed for all, the byte streams of different models start
            # alike, their first chunks deduplicate across models, and a zero-copy load of a tensor
            # whose chunks then lie in another model's tensor needs an assembled copy (measured:
            # GPT-2's wte after BERT's word embeddings, 17.8 ms instead of about 2 ms).
            state = M.random_state(lay, seed=zlib.crc32(f"load/{name}".encode()))
            want = digests(state)
            nb = M.nbytes(lay)
            paths = {s: files / f"{name}{ext}" for s, (ext, _, _) in FILE_BASELINES.items()}
            for s, (_, save, _) in FILE_BASELINES.items():
                save(state, paths[s])
            c.save_model(name, state, wait=True)
            if r:
                redis_store(r, name, state)
            ways: Dict[str, Callable[[], Dict[str, Any]]] = {
                "cairn": lambda n=name: {k: torch.from_numpy(v) for k, v in c.load_model(n).items()},
                "cairn copy": lambda n=name: {k: torch.from_numpy(v) for k, v in c.load_model(n, copy=True).items()},
                "torch.save": lambda p=paths["torch.save"]: load_torch(p),
                "safetensors": lambda p=paths["safetensors"]: load_safetensors(p),
                "h5py": lambda p=paths["h5py"]: {k: torch.from_numpy(v) for k, v in load_h5(p).items()},
            }
            if r:
                ways["redis"] = lambda n=name: {k: torch.from_numpy(v) for k, v in redis_load(r, n).items()}
            # What docs/python.md tells a PyTorch user to call: copy-on-write views of the arena, for
            # a state dict and for a module (its parameters take the views; no byte copied).
            ways["cairn.torch.load"] = lambda n=name: ct.load(n, client=c)
            target = cow_target = None
            if spec.get("into_module", True):
                target = real_module(name)
                cow_target = real_module(name)  # its parameters end up aliasing the arena
            for way, fn in ways.items():
                check_same(f"load: {way} {name}", fn(), want)  # warm up and check
                if way == "cairn.torch.load" and cow_target is not None:
                    into = (lambda n=name: ct.load(n, cow_target, client=c))
                    into()
                    check_same(f"load: {way} into a module {name}", cow_target.state_dict(), want)
                else:
                    into = (lambda f=fn: target.load_state_dict(f(), strict=True))
                t_sd, t_mod = [], []
                for _ in range(reps):
                    t0 = now()
                    out = fn()
                    t_sd.append(now() - t0)
                    del out
                    if target is not None:
                        t0 = now()
                        into()
                        t_mod.append(now() - t0)
                sysname = way
                ctx.res.add(W, f"warm load s: {name}", sysname, t_sd, "s", "lower",
                            f"state dict of {nb / 2**20:.1f} MiB, median of {reps}; files in the page cache")
                if t_mod:
                    how = ("ct.load(id, module): the parameters take copy-on-write views of the arena (no copy)"
                           if way == "cairn.torch.load" else
                           "state dict then load_state_dict into a built module (copies every byte)")
                    ctx.res.add(W, f"warm load into module s: {name}", sysname, t_mod, "s", "lower", how)
            for csys in ("cairn", "cairn copy", "cairn.torch.load"):
                ctx.res.goal(W, f"warm load s: {name}", "safetensors", "<= 0.5", csys)
                ctx.res.goal(W, f"warm load s: {name}", "torch.save", "<= 0.2", csys)
            # Into a module: cairn.torch.load(id, module) is the way (goal: 5x faster than
            # safetensors load_file + load_state_dict); the rows above that copy with
            # load_state_dict are for information.
            ctx.res.goal(W, f"warm load into module s: {name}", "safetensors", "<= 0.2", "cairn.torch.load")
            ctx.res.goal(W, f"warm load into module s: {name}", "torch.save", "<= 0.2", "cairn.torch.load")
            # Physical limits: memcpy of the same bytes; plain sequential read of the same bytes (warm).
            flat = [np.ascontiguousarray(v).reshape(-1).view(np.uint8) for v in state.values()]
            dst = np.empty(nb, np.uint8)
            tm = []
            for _ in range(max(3, reps)):
                t0 = now()
                off = 0
                for f in flat:
                    dst[off:off + f.size] = f
                    off += f.size
                tm.append(now() - t0)
            ctx.res.add(W, f"warm load s: {name}", "memcpy", tm, "s", "lower", "memcpy of the model's bytes")
            tr = [plain_read(paths["safetensors"], dst) for _ in range(max(3, reps))]
            ctx.res.add(W, f"warm load s: {name}", "read", tr, "s", "lower",
                        "plain sequential read(2) of the safetensors file into a buffer (page cache)")
            del dst, flat
            # Cold: page cache dropped; for cairn a fresh daemon (bytes come from the repository).
            if spec.get("cold", True) and target is not None:
                c.close()
                for way in ("cairn", "cairn copy", "torch.save", "safetensors", "h5py", "read"):
                    ts = []
                    how = ""
                    for _ in range(spec.get("cold_repeats", 1)):
                        if way.startswith("cairn"):
                            d.stop()
                        how = drop_caches(list(paths.values()) + [d.repo])
                        if way.startswith("cairn"):
                            d.start()
                            c = d.connect()
                            t0 = now()
                            target.load_state_dict(ways[way](), strict=True)
                            ts.append(now() - t0)
                            c.close()
                        elif way == "read":
                            buf = np.empty(os.path.getsize(paths["safetensors"]), np.uint8)
                            ts.append(plain_read(paths["safetensors"], buf))
                            del buf
                        else:
                            t0 = now()
                            target.load_state_dict(ways[way](), strict=True)
                            ts.append(now() - t0)
                    ctx.res.add(W, f"cold load into module s: {name}", way, ts, "s", "lower",
                                f"page cache dropped ({how})" + ("; fresh cairnd, bytes from the repository"
                                                               if way.startswith("cairn") else ""))
                c = d.connect()
            del target, state
        if r:
            r.close()
        c.close()
    finally:
        d.stop()
        rs.stop()
        shutil.rmtree(root, ignore_errors=True)


def plain_read(path: Path, buf: np.ndarray) -> float:
    mv = memoryview(buf).cast("B")
    t0 = now()
    with open(path, "rb", buffering=0) as f:
        got = 0
        while True:
            k = f.readinto(mv[got:got + (64 << 20)])
            if not k:
                break
            got += k
    return now() - t0


def real_module(name: str):
    """A module with storage (to load_state_dict into), built from the same definitions."""
    import torch
    import models as M
    torch.manual_seed(0)
    if name == "resnet50":
        import torchvision
        return torchvision.models.resnet50()
    if name == "vit_b_16":
        import torchvision
        return torchvision.models.vit_b_16()
    if name == "bert_base":
        return M.BertBase("cpu")
    if name == "gpt2_small":
        return M.Gpt2Small("cpu")
    raise ValueError(name)


# ---------------------------------------------------------------------------------------------
# workload: ensemble

def _ensemble_member(task: Dict[str, Any]) -> Dict[str, Any]:
    """One ensemble member (runs in its own process): load the base at start_at, change the head,
    store. Returns its times."""
    import torch  # noqa: F401
    import models as M
    sysname, start_at = task["system"], task["start_at"]
    lay = M.layout(task["model"])
    head = task["head"]
    while now() < start_at:
        time.sleep(max(0.0, min(0.01, start_at - now())))
    c = None
    if sysname == "cairn":
        import cairn
        c = cairn.connect(task["socket"])
    t0 = now()
    if sysname == "cairn":
        base = c.load_model(task["base"])
    else:
        base = FILE_BASELINES[sysname][2](Path(task["path"]))
    t1 = now()
    bad = [k for k in lay if digest(base[k]) != task["want"][k]]
    new = M.random_state(lay, seed=task["member"] + 1000, names=head)
    t2 = now()
    if sysname == "cairn":
        c.save_model(task["id"], new, parent=task["base"], inherit_all=True, wait=True)
    else:
        state = {k: (new[k] if k in new else (base[k] if isinstance(base[k], np.ndarray) else base[k].numpy()))
                 for k in lay}
        FILE_BASELINES[sysname][1](state, Path(task["out"]))
    t3 = now()
    del base
    if c:
        c.close()
    return {"t0": t0, "t1": t1, "store": t3 - t2, "bad": bad[:3]}


def run_ensemble(spec: Dict[str, Any], ctx: "Context") -> None:
    B = baselines(spec)
    import models as M

    W = "ensemble"
    root = ctx.tmp / "ensemble"
    d = Cairnd(root / "cairn", spec.get("dram", "4GiB"), trace=ctx.trace("ensemble")).start()
    files = root / "files"
    files.mkdir(parents=True, exist_ok=True)
    n, model, reps = spec["members"], spec["model"], spec["repeats"]
    lay = M.layout(model)
    head = [k for k in lay if any(k.startswith(p) for p in spec["head_prefixes"])]
    if not head:
        raise RuntimeError(f"ensemble: no tensor of {model} starts with {spec['head_prefixes']}")
    state = M.random_state(lay, seed=11)
    want = digests(state)
    nb = M.nbytes(lay)
    pool = mp.get_context("spawn").Pool(n)
    try:
        c = d.connect()
        c.save_model("base", state, wait=True)
        c.close()
        paths = {s: files / f"base{ext}" for s, (ext, _, _) in B.items()}
        for s, (_, save, _) in B.items():
            save(state, paths[s])
        del state
        pool.map(_noop, range(n), chunksize=1)  # start the workers (imports) before timing
        walls = {s: [] for s in ["cairn", *B]}
        stores = {s: [] for s in walls}
        repo_bytes: List[float] = []
        how = ""
        for rep in range(reps):
            for s in walls:
                if s == "cairn":
                    d.stop()
                how = drop_caches(list(paths.values()) + [d.repo])
                before = None
                if s == "cairn":
                    d.start()
                    c = d.connect()
                    before = c.stats()
                    c.hint("will_load", ["base"])  # every member reads the base next
                start_at = now() + 1.0
                tasks = [{"system": s, "start_at": start_at, "model": model, "head": head, "member": i,
                          "socket": d.socket, "base": "base", "id": f"member/{rep}/{i}",
                          "path": str(paths.get(s, "")), "out": str(files / f"member{i}{B.get(s, ('',))[0]}"),
                          "want": want} for i in range(n)]
                outs = pool.map(_ensemble_member, tasks, chunksize=1)
                bad = [o["bad"] for o in outs if o["bad"]]
                if bad:
                    raise CorrectnessError(f"ensemble: {s}: a member loaded tensors that differ: {bad[0]}")
                walls[s].append(max(o["t1"] for o in outs) - min(o["t0"] for o in outs))
                stores[s].extend(o["store"] for o in outs)
                if s == "cairn":
                    after = c.stats()
                    mv = after.get("movement", {})
                    mv0 = before.get("movement", {})
                    repo_bytes.append(mv.get("bytes_from_repository", 0) - mv0.get("bytes_from_repository", 0))
                    c.close()
        ctx.res.add(W, "concurrent load wall s", "cairn", walls["cairn"], "s", "lower",
                    f"{n} processes load {model} ({nb / 2**20:.1f} MiB) at once, zero-copy, from a freshly "
                    f"started cairnd, page cache dropped ({how}); median of {reps}")
        for s in B:
            ctx.res.add(W, "concurrent load wall s", s, walls[s], "s", "lower",
                        f"{n} processes read the same file at once, page cache dropped ({how})")
        ctx.res.add(W, "member store s", "cairn", stores["cairn"], "s", "lower",
                    f"save_model(head only: {len(head)} tensors, parent=base, inherit_all), durability global")
        for s in B:
            ctx.res.add(W, "member store s", s, stores[s], "s", "lower", "whole fine-tuned model to a file + fsync")
        ctx.res.add(W, "bytes read from repository per node", "cairn", repo_bytes, "bytes", "lower",
                    "stats movement.bytes_from_repository during the concurrent loads")
        ctx.res.add(W, "bytes read from repository per node", "base once", [nb], "bytes", "lower",
                    "the base model's bytes, once (the goal)")
        ctx.res.goal(W, "bytes read from repository per node", "base once", "<= 1.0")
        for s in B:
            ctx.res.add(W, "bytes read from repository per node", s, [n * os.path.getsize(paths[s])], "bytes",
                        "lower", f"each of the {n} processes reads the whole file through the filesystem (on a "
                        "PFS client without a shared cache, N x size; on this single VM the page cache serves "
                        "the repeats)")
    finally:
        pool.terminate()
        pool.join()
        d.stop()
        shutil.rmtree(root, ignore_errors=True)


def _noop(_: int) -> int:
    import torch  # noqa: F401
    import cairn  # noqa: F401
    import models  # noqa: F401
    import safetensors.torch  # noqa: F401
    import h5py  # noqa: F401
    return 0


# ---------------------------------------------------------------------------------------------
# workload: checkpoint

def run_checkpoint(spec: Dict[str, Any], ctx: "Context") -> None:
    B = baselines(spec)
    import cairn
    import models as M

    W = "checkpoint"
    root = ctx.tmp / "checkpoint"
    d = Cairnd(root / "cairn", spec.get("dram", "4GiB"), spec.get("nvme"), trace=ctx.trace("checkpoint")).start()
    # The job's prologue starts cairnd long before a training job's first checkpoint: its arena is
    # backed by then (the first checkpoint still pays for the new connection).
    backed_s = d.wait_backed()
    files = root / "files"
    files.mkdir(parents=True, exist_ok=True)
    model, steps, every, step_s = spec["model"], spec["steps"], spec["every"], spec["step_seconds"]
    lay = M.layout(model)
    nb = M.nbytes(lay)
    init = M.random_state(lay, seed=21)

    def train_step(state: Dict[str, np.ndarray], step: int) -> None:
        time.sleep(step_s)  # the step's compute (on a GPU: the CPU is free meanwhile)
        for v in state.values():  # every tensor changes, in every MiB: nothing dedupes between checkpoints
            flat = v.reshape(-1)
            flat[:: 262144] += 1

    try:
        c = d.connect()
        blocking = {s: [] for s in ["cairn", *B]}
        to_global: List[float] = []
        last_want: Dict[str, str] = {}
        for s in blocking:
            state = {k: v.copy() for k, v in init.items()}
            pending: List[Tuple[cairn.Ticket, float]] = []
            for step in range(1, steps + 1):
                train_step(state, step)
                for t, t0 in list(pending):  # has an earlier checkpoint reached the repository?
                    try:
                        t.wait(timeout=0)
                        to_global.append(now() - t0)
                        pending.remove((t, t0))
                    except cairn.Timeout:
                        pass
                if step % every:
                    continue
                ck = step // every
                if s == "cairn":
                    t0 = now()
                    tk = c.save_model(f"ckpt/{ck}", state, durability="global", wait=False)
                    blocking[s].append(now() - t0)
                    pending.append((tk, t0))
                    if ck > 1:  # a restart would read the newest: the one before is done
                        c.hint("done", [f"ckpt/{ck - 1}"])
                else:
                    ext, save, _ = B[s]
                    t0 = now()
                    save(state, files / f"ckpt{ck}{ext}")
                    blocking[s].append(now() - t0)
            for t, t0 in pending:
                t.wait()
                to_global.append(now() - t0)
            last_want = digests(state)
            last = steps // every
            if s == "cairn":
                c.hint("will_load", [f"ckpt/{last}"])
                check_same("checkpoint: cairn load of the last checkpoint", c.load_model(f"ckpt/{last}"), last_want)
            else:
                ext, _, load = B[s]
                check_same(f"checkpoint: {s} load of the last checkpoint", load(files / f"ckpt{last}{ext}"), last_want)
                for p in files.glob(f"ckpt*{ext}"):
                    p.unlink()
            del state
        ncp = steps // every
        ctx.res.add(W, "blocking s per checkpoint", "cairn", blocking["cairn"], "s", "lower",
                    f"{model} ({nb / 2**20:.1f} MiB), {ncp} checkpoints every {every} steps of {step_s} s; "
                    f"daemon's arena backed before the loop (as after a prologue; it took {backed_s:.1f} s); "
                    "save_model returns once the bytes are in the daemon's memory (durability global, not waited: "
                    "the daemon flushes behind the training loop); median over checkpoints")
        for s in B:
            ctx.res.add(W, "blocking s per checkpoint", s, blocking[s], "s", "lower", "write + fsync, median over checkpoints")
            ctx.res.goal(W, "blocking s per checkpoint", s, "<= 0.1")
        ctx.res.add(W, "time to global s (cairn, information)", "cairn", to_global, "s", "lower",
                    f"from save_model to the ticket reaching the repository, seen at step granularity ({step_s} s)")
        # Physical limits for the same bytes.
        flat = [v.reshape(-1).view(np.uint8) for v in init.values()]
        dst = np.empty(nb, np.uint8)
        tm = []
        for _ in range(3):
            t0 = now()
            off = 0
            for f in flat:
                dst[off:off + f.size] = f
                off += f.size
            tm.append(now() - t0)
        ctx.res.add(W, "blocking s per checkpoint", "memcpy", tm, "s", "lower", "memcpy of the checkpoint's bytes")
        ctx.res.goal(W, "blocking s per checkpoint", "memcpy", "<= 1.3")  # a GPT-2-small checkpoint (148 tensors) blocks at most 1.3x a memcpy
        tw = []
        for i in range(3):
            p = files / f"raw{i}"
            t0 = now()
            with open(p, "wb", buffering=0) as f:
                for x in flat:
                    f.write(memoryview(x))
                os.fsync(f.fileno())
            tw.append(now() - t0)
            p.unlink()
        ctx.res.add(W, "blocking s per checkpoint", "write+fsync", tw, "s", "lower",
                    "write(2) of the same bytes to one file + fsync")
        c.close()
    finally:
        d.stop()
        shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# workload: coupled

def coupled_binaries() -> Optional[Tuple[Path, Path]]:
    for b in (BUILD / "bin", ROOT / "build" / "bin"):
        p, q = b / "cairn_coupled_producer", b / "cairn_coupled_consumer"
        if p.exists() and q.exists():
            return p, q
    return None


def run_coupled(spec: Dict[str, Any], ctx: "Context") -> None:
    W = "coupled"
    bins = coupled_binaries()
    if not bins:
        ctx.res.add(W, "skipped", "-", [], "", "lower",
                    f"cairn_coupled_producer/consumer not found in {BUILD / 'bin'}: build them with "
                    "`ninja -C build cairn_coupled_producer cairn_coupled_consumer` (or scripts/build)")
        return
    prod, cons = bins
    root = ctx.tmp / "coupled"
    d = Cairnd(root / "cairn", spec.get("dram", "2GiB")).start()
    rs = RedisServer(root / "redis")
    systems = {"cairn": d.socket}
    try:
        rs.start()
        systems["redis"] = rs.socket
    except Exception as e:  # noqa: BLE001
        ctx.res.add(W, "skipped", "redis", [], "", "lower", f"redis baseline skipped: {e}")
    steps, nbytes, reps, poll = spec["steps"], spec["bytes"], spec["repeats"], spec.get("poll_ms", 1)
    gb = steps * nbytes / 1e9
    try:
        for mode in ("throughput", "latency"):
            for s, addr in systems.items():
                thr, lat, lat_all = [], [], []
                for rep in range(reps):
                    prefix = f"{mode}/{rep}"
                    common = ["--backend", s, "--address", addr, "--steps", str(steps), "--bytes", str(nbytes),
                              "--prefix", prefix, "--poll-ms", str(poll)] + (["--ack"] if mode == "latency" else [])
                    cp = subprocess.Popen([str(cons)] + common, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                    pp = subprocess.Popen([str(prod)] + common, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                    try:
                        pout, perr = pp.communicate(timeout=300)
                        cout, cerr = cp.communicate(timeout=300)
                    except subprocess.TimeoutExpired:
                        pp.kill()
                        cp.kill()
                        pp.communicate()
                        cp.communicate()
                        raise RuntimeError(f"coupled {s} {mode}: producer/consumer did not finish in 300 s")
                    if cp.returncode == 3:
                        raise CorrectnessError(f"coupled {s} {mode}: the consumer read bytes that differ from the "
                                               f"producer's: {cerr.decode(errors='replace').strip()[-500:]} {cout[:200]!r}")
                    if pp.returncode or cp.returncode:
                        if "built without hiredis" in (perr + cerr).decode(errors="replace"):
                            ctx.res.add(W, "skipped", s, [], "", "lower", "the C programs were built without hiredis")
                            break
                        raise RuntimeError(f"coupled {s} {mode}: producer exit {pp.returncode}, consumer exit "
                                           f"{cp.returncode}: {(perr + cerr).decode(errors='replace').strip()[-1000:]}")
                    po, co = json.loads(pout), json.loads(cout)
                    if co.get("bad_words"):
                        raise CorrectnessError(f"coupled {s} {mode}: {co['bad_words']} words differ")
                    start, have = po["start_ns"], co["have_ns"]
                    thr.append(steps * nbytes / (max(have) - min(start)))  # bytes per ns = GB/s
                    lat.append(median([(h - t) / 1e9 for h, t in zip(have, start)]))
                    lat_all.extend((h - t) / 1e9 for h, t in zip(have, start))
                else:
                    if mode == "throughput":
                        ctx.res.add(W, "throughput GB/s", s, thr, "GB/s", "higher",
                                    f"{steps} steps x {nbytes / 2**20:.0f} MiB, producer puts as fast as it can; first "
                                    f"put to last byte in the consumer's buffer; median of {reps}"
                                    + (f"; Redis via hiredis on a Unix socket, SET/GET, consumer polls EXISTS every "
                                       f"{poll} ms (SmartRedis poll_tensor)" if s == "redis" else
                                       "; cairn_put_tensor / cairn_poll_tensor / cairn_unpack_tensor"))
                    else:
                        ctx.res.add(W, "latency s per step", s, lat, "s", "lower",
                                    f"put start -> bytes in the consumer's buffer, the producer waiting for an ack "
                                    f"before the next step; median over all {len(lat_all)} steps of {reps} runs "
                                    f"(p90 {np.percentile(lat_all, 90) * 1e3:.2f} ms); repeats: per-run medians",
                                    value=median(lat_all))
        # memcpy: the physical limit for moving the same bytes.
        out = subprocess.run([str(prod), "--backend", "memcpy", "--steps", str(steps), "--bytes", str(nbytes)],
                             capture_output=True, timeout=300, check=True)
        po = json.loads(out.stdout)
        per = [(e - s) / 1e9 for s, e in zip(po["start_ns"], po["end_ns"])]
        ctx.res.add(W, "throughput GB/s", "memcpy", [nbytes / p / 1e9 for p in per], "GB/s", "higher",
                    "memcpy of each step's bytes into a private buffer", value=steps * nbytes / sum(per) / 1e9)
        ctx.res.add(W, "latency s per step", "memcpy", per, "s", "lower", "memcpy of one step's bytes")
        _ = gb
    finally:
        d.stop()
        rs.stop()
        shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------------------------------------

RUNNERS = {"nas": run_nas, "load": run_load, "ensemble": run_ensemble, "checkpoint": run_checkpoint,
           "coupled": run_coupled}


class Context:
    def __init__(self, tmp: Path, res: Results, verbose: bool, trace_dir: Optional[Path] = None) -> None:
        self.tmp, self.res, self.verbose, self.trace_dir = tmp, res, verbose, trace_dir

    def trace(self, workload: str) -> Optional[Path]:
        """Where the workload's cairnd records its trace (--trace DIR), else None."""
        return self.trace_dir / f"{workload}.csv" if self.trace_dir else None


def load_spec(name: str, quick: bool, trace: bool = False) -> Dict[str, Any]:
    """The spec's parameter set: "trace" when recording traces and the spec has one, else "quick"
    or "full"."""
    doc = json.loads((SPECS / f"{name}.json").read_text())
    if trace and "trace" in doc:
        return doc["trace"]
    return doc["quick" if quick else "full"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small parameters (a correctness run, ~3 minutes)")
    ap.add_argument("--only", help=f"comma-separated workloads (default: all of {','.join(ORDER)})")
    ap.add_argument("--out", required=True, help="directory for workloads.json")
    ap.add_argument("--tmpdir", default=os.environ.get("CAIRN_BENCH_TMPDIR", "/var/tmp"),
                    help="where the temporary repositories and files go (a disk, not tmpfs; default /var/tmp)")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--trace", metavar="DIR",
                    help="record each workload's cairnd trace as DIR/<workload>.csv (policy.trace; docs/policy.md), "
                         "with the spec's small \"trace\" parameter set where it has one (no file baselines)")
    args = ap.parse_args()
    names = [n.strip() for n in args.only.split(",")] if args.only else list(ORDER)
    unknown = [n for n in names if n not in RUNNERS]
    if unknown:
        ap.error(f"unknown workload(s) {unknown}; known: {', '.join(ORDER)}")
    if not (BUILD / "bin" / "cairnd").exists():
        print(f"error: {BUILD / 'bin' / 'cairnd'} not found: build first (scripts/build)", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="cairn-workloads-", dir=args.tmpdir))
    res = Results()
    trace_dir = Path(args.trace).resolve() if args.trace else None
    if trace_dir:
        trace_dir.mkdir(parents=True, exist_ok=True)
    ctx = Context(tmp, res, args.verbose, trace_dir)
    timings = {}
    t_all = now()
    try:
        for n in names:
            t0 = now()
            print(f"== {n} ({'trace' if trace_dir else 'quick' if args.quick else 'full'})", flush=True)
            try:
                RUNNERS[n](load_spec(n, args.quick, trace_dir is not None), ctx)
            except CorrectnessError as e:
                res.error(n, e, True)
                print(f"   CORRECTNESS FAILURE: {e}", flush=True)
            except Exception as e:  # noqa: BLE001
                res.error(n, e, False)
                print(f"   error: {type(e).__name__}: {e}", flush=True)
            timings[n] = now() - t0
            print(f"   {timings[n]:.1f} s", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    machine = machine_info(Path(args.tmpdir))
    machine["workload_seconds"] = timings
    machine["total_seconds"] = now() - t_all
    ratios = res.ratios()
    doc = {"machine": machine, "quick": args.quick, "rows": res.rows, "ratios": ratios}
    (out / "workloads.json").write_text(json.dumps(doc, indent=1) + "\n")
    print_table(ratios, res.rows)
    print(f"\nwrote {out / 'workloads.json'} ({machine['total_seconds']:.0f} s)")
    if res.correctness_failures:
        print("correctness failures:\n  " + "\n  ".join(res.correctness_failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
