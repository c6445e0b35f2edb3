"""The near-data compute worker (docs/near.md): ``python -m cairn.near_worker``, started by cairnd on
the first ``compute`` request when ``compute.enabled`` is set. It is a client of its daemon (reads
models and dataset shards from the shared arena, stores activations there), and serves trainers on a
Unix socket beside the daemon's and, with ``compute.listen``, over TCP.

Requests (frames of cairn._near_wire; every reply is one frame unless said):
  hello                          -> {pid, memory, free, threads}
  echo {size}                    -> size payload bytes (for measuring the link)
  profile {model, dataset, samples, prep, split_max}
                                 -> per-layer seconds and output bytes per sample, the memory model,
                                    which splits are cached for the dataset
  features {model, dataset, shards, split, prep, local}
                                 -> one frame per shard, in order, then {done}
  stats                          -> counters (forward passes per prefix and shard, cache hits, bytes)
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from . import _near_wire as wire
from . import data as _data
from . import near
from ._errors import AlreadyExists, NotFound
from .client import Client, connect

ACT_PREFIX = "cairn-act-"


def act_id(sig: str, shard_hash: str, prep: str) -> str:
    return f"{ACT_PREFIX}{sig[:20]}-{shard_hash[:20]}-{prep}"


def free_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


class Worker:
    def __init__(self, daemon: str, memory: int, cache: int, threads: int) -> None:
        self.daemon = daemon
        self.memory = memory
        self.threads = threads
        self.local = threading.local()
        self.lock = threading.Lock()  # one computation at a time: the memory budget is the worker's
        self.models: "collections.OrderedDict[str, Tuple[Dict[str, Any], List[torch.nn.Module]]]" = collections.OrderedDict()
        self.mu = threading.Lock()  # the cache index and counters
        self.acts: "collections.OrderedDict[str, Tuple[str, int]]" = collections.OrderedDict()  # id -> (sig, bytes)
        self.act_bytes = 0
        c = self.client()
        if cache <= 0:
            cache = int(c.stats()["tiers"]["dram"].get("capacity_bytes", 1 << 30)) // 4
        self.cache = cache
        self.forward: Dict[str, int] = collections.Counter()  # "sig/shard" -> forward passes
        self.counters = collections.Counter()
        self.known: Dict[str, List[str]] = {}  # model id -> its prefix signatures ([] = not near)
        self.last_sweep = 0.0
        for m in c.list():  # activations a previous worker left
            if m["id"].startswith(ACT_PREFIX):
                self.acts[m["id"]] = (m["id"][len(ACT_PREFIX):len(ACT_PREFIX) + 20], int(m.get("bytes", 0)))
                self.act_bytes += int(m.get("bytes", 0))

    def client(self) -> Client:
        c = getattr(self.local, "c", None)
        if c is None:
            c = self.local.c = connect(self.daemon)
        return c

    # ---- models and the activation cache ----

    def prefix(self, model: str, split: int) -> Tuple[Dict[str, Any], List[torch.nn.Module]]:
        with self.mu:
            got = self.models.get(model)
            if got is not None:
                self.models.move_to_end(model)
        if got is None:
            c = self.client()
            spec = near.spec_of(c, model)
            module = near.load_module(c, model, spec)
            got = (spec, near.layers(module))
            with self.mu:
                self.models[model] = got
                while len(self.models) > 4:
                    self.models.popitem(last=False)
        spec, ls = got
        if not 0 <= split <= spec["frozen"]:
            raise ValueError(f"split {split} of model {model!r}: it must be in 0..{spec['frozen']} (its frozen layers)")
        return spec, ls[:split]

    def cached(self, c: Client, aid: str) -> bool:
        with self.mu:
            if aid in self.acts:
                self.acts.move_to_end(aid)
                return True
        try:
            c.show(aid)
        except NotFound:
            return False
        return True

    def remember(self, c: Client, aid: str, sig: str, nbytes: int) -> None:
        drop = []
        with self.mu:
            self.acts[aid] = (sig, nbytes)
            self.act_bytes += nbytes
            while self.act_bytes > self.cache and len(self.acts) > 1:
                old, (_, b) = self.acts.popitem(last=False)
                self.act_bytes -= b
                drop.append(old)
        for old in drop:
            self._remove(c, old, "over compute.cache")

    def _remove(self, c: Client, aid: str, why: str) -> None:
        try:
            c.remove(aid)
            self.counters["activations_dropped"] += 1
        except Exception as e:  # already gone: nothing to do
            print(f"cairn near worker: dropping {aid} ({why}): {e}", file=sys.stderr)

    def sweep(self, c: Client) -> None:
        """Drops the activations of prefixes that no live model has (at most every 10 s)."""
        now = time.monotonic()
        if now - self.last_sweep < 10.0:
            return
        self.last_sweep = now
        live = set()
        for m in c.list():
            mid = m["id"]
            if mid.startswith(ACT_PREFIX):
                continue
            if mid not in self.known:
                try:
                    spec = (c.show(mid).get("metadata") or {}).get(near.META_KEY) or {}
                except NotFound:
                    continue
                self.known[mid] = [s[:20] for s in spec.get("signatures", [])]
            live.update(self.known[mid])
        with self.mu:
            dead = [a for a, (sig, _) in self.acts.items() if sig not in live]
            for a in dead:
                self.act_bytes -= self.acts.pop(a)[1]
        for a in dead:
            self._remove(c, a, "no live model has its prefix")

    # ---- requests ----

    def hello(self, req: Dict[str, Any]) -> Dict[str, Any]:
        return {"pid": os.getpid(), "memory": self.memory, "free": free_memory(), "threads": torch.get_num_threads(),
                "cache": self.cache}

    def profile(self, req: Dict[str, Any]) -> Dict[str, Any]:
        c = self.client()
        model, dataset = str(req["model"]), str(req["dataset"])
        prep = req.get("prep") or near.DEFAULT_PREP
        spec, _ = self.prefix(model, 0)
        frozen = spec["frozen"]
        _, ls = self.prefix(model, frozen)
        x, _ = _data.read_shard(c, dataset, 0, labels=False)
        n = max(1, min(int(req.get("samples", 8)), x.shape[0]))
        xin = near.preprocess(torch.from_numpy(np.array(x[:n])), prep)
        with self.lock:
            times, sizes = near.profile_layers(ls, xin)
        in_bytes = int(x[0].nbytes)
        fixed, per = near.memory_model(ls, in_bytes, sizes)
        dinfo = _data.info(dataset, c)
        shards = req.get("shards") or list(range(dinfo["shards"]))
        pk = near.prep_key(prep)
        cached = [False] + [all(self.cached(c, act_id(spec["signatures"][k], dinfo["hashes"][s], pk)) for s in shards)
                            for k in range(1, frozen + 1)]
        return {"frozen": frozen, "seconds": times, "out_bytes": [in_bytes] + sizes, "mem_fixed": fixed,
                "mem_per_sample": per, "memory": self.memory, "free": free_memory(), "cached": cached}

    def features(self, conn: socket.socket, req: Dict[str, Any]) -> None:
        c = self.client()
        model, dataset = str(req["model"]), str(req["dataset"])
        split = int(req["split"])
        prep = req.get("prep") or near.DEFAULT_PREP
        local = bool(req.get("local", False))
        spec, ls = self.prefix(model, split)
        dinfo = _data.info(dataset, c)
        shards = req.get("shards")
        shards = list(range(dinfo["shards"])) if shards is None else [int(s) for s in shards]
        for s in shards:
            if not 0 <= s < dinfo["shards"]:
                raise ValueError(f"dataset {dataset!r} has shards 0..{dinfo['shards'] - 1}, not {s}")
        pk = near.prep_key(prep)
        sig = spec["signatures"][split]
        self.sweep(c)
        self.counters["requests"] += 1
        batch = None
        for s in shards:
            has_y = dinfo.get("y") is not None
            head: Dict[str, Any] = {"shard": s}
            if split == 0:  # vanilla: the raw inputs
                x, y = _data.read_shard(c, dataset, s, labels=has_y)
                if local:
                    head["dataset"] = dataset
                    wire.send(conn, head)
                    continue
                payload = [x, y] if y is not None else [x]
                self._send_arrays(conn, head, payload)
                continue
            aid = act_id(sig, dinfo["hashes"][s], pk)
            acts = None
            if self.cached(c, aid):
                self.counters["cache_hits"] += 1
                head["cached"] = True
                if not local:
                    acts = c.load_model(aid, names=["a"])["a"]
            else:
                self.counters["cache_misses"] += 1
                x, _ = _data.read_shard(c, dataset, s, labels=False)
                with self.lock:
                    xin = near.preprocess(torch.from_numpy(np.array(x)), prep)
                    if batch is None:
                        _, sizes = near.profile_layers(ls, xin[:1], repeats=0)
                        fixed, per = near.memory_model(ls, int(x[0].nbytes), sizes)
                        batch = near.worker_batch(self.memory, free_memory(), fixed[-1], per[-1], x.shape[0])
                    t0 = time.perf_counter()
                    out = near.run_layers(ls, xin, batch).contiguous()
                    head["compute_s"] = time.perf_counter() - t0
                with self.mu:
                    self.forward[f"{sig[:20]}/{dinfo['hashes'][s][:20]}"] += 1
                acts = out.numpy()
                try:
                    c.save_model(aid, {"a": acts}, durability="memory", wait=True,
                                 meta={"cairn.activations": {"signature": sig, "dataset": dataset, "shard": s,
                                                             "shard_hash": dinfo["hashes"][s], "prep": prep,
                                                             "model": model, "split": split}})
                    self.remember(c, aid, sig[:20], int(acts.nbytes))
                except AlreadyExists:  # another request computed it at the same time
                    pass
                except Exception as e:  # noqa: BLE001 - a full arena: serve it uncached
                    print(f"cairn near worker: not caching {aid}: {e}", file=sys.stderr)
                head["cached"] = False
            head["batch"] = batch
            if local:
                head["model"] = aid
                wire.send(conn, head)
            else:
                y = _data.read_shard(c, dataset, s, labels=True)[1] if has_y else None
                self._send_arrays(conn, head, [acts] + ([y] if y is not None else []))
        wire.send(conn, {"done": True})

    def _send_arrays(self, conn: socket.socket, head: Dict[str, Any], arrays: List[np.ndarray]) -> None:
        arrays = [np.ascontiguousarray(a) for a in arrays]
        head["arrays"] = [{"dtype": a.dtype.str, "shape": list(a.shape)} for a in arrays]
        sent = wire.send(conn, head, *arrays)
        with self.mu:
            self.counters["bytes_sent"] += sent

    def stats(self) -> Dict[str, Any]:
        with self.mu:
            return {"forward": dict(self.forward), "counters": dict(self.counters), "cached_activations": len(self.acts),
                    "cached_bytes": self.act_bytes, "cache_budget": self.cache}

    def serve(self, conn: socket.socket) -> None:
        try:
            while True:
                try:
                    req, payload = wire.recv(conn)
                except (ConnectionError, OSError):
                    return
                except wire.ProtocolError as e:
                    wire.send(conn, {"error": f"bad frame: {e}"})
                    return
                op = req.get("op")
                try:
                    if op == "features":
                        self.features(conn, req)
                        continue
                    if op == "hello":
                        wire.send(conn, self.hello(req))
                    elif op == "echo":
                        size = int(req.get("size", 0))
                        if not 0 <= size <= 1 << 30:
                            raise ValueError(f"echo size {size} is outside 0..1 GiB")
                        wire.send(conn, {"size": size}, bytes(size))
                    elif op == "profile":
                        wire.send(conn, self.profile(req))
                    elif op == "stats":
                        wire.send(conn, self.stats())
                    else:
                        raise ValueError(f"unknown near-data request op {op!r}")
                except (ConnectionError, BrokenPipeError):
                    return
                except KeyError as e:
                    wire.send(conn, {"error": f"request {op!r}: missing field {e}"})
                except Exception as e:  # noqa: BLE001 - the client gets the message, the worker lives on
                    if os.environ.get("CAIRN_NEAR_DEBUG"):
                        traceback.print_exc()
                    wire.send(conn, {"error": f"{type(e).__name__}: {e}"})
        finally:
            conn.close()


def _listen(w: Worker, srv: socket.socket) -> None:
    while True:
        try:
            conn, _ = srv.accept()
        except OSError:
            return
        threading.Thread(target=w.serve, args=(conn,), daemon=True).start()


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cairn.near_worker")
    ap.add_argument("--daemon", required=True, help="the daemon's socket")
    ap.add_argument("--socket", required=True, help="the Unix socket to serve on")
    ap.add_argument("--listen", default="", help="also serve over TCP at HOST:PORT (port 0: any)")
    ap.add_argument("--ready-fd", type=int, default=-1, help="write one JSON line here when ready")
    ap.add_argument("--memory", type=int, default=1 << 30)
    ap.add_argument("--cache", type=int, default=0)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("CAIRN_COMPUTE_THREADS", "0")))
    args = ap.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    w = Worker(args.daemon, args.memory, args.cache, args.threads)
    servers = []
    try:
        os.unlink(args.socket)
    except FileNotFoundError:
        pass
    u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    u.bind(args.socket)
    os.chmod(args.socket, 0o600)
    u.listen(64)
    servers.append(u)
    listen = ""
    if args.listen:
        host, _, port = args.listen.rpartition(":")
        t = socket.create_server((host.strip("[]"), int(port)), family=socket.AF_INET6 if ":" in host else socket.AF_INET,
                                 backlog=64)
        servers.append(t)
        h, p = t.getsockname()[:2]
        listen = f"{h}:{p}"
    for s in servers:
        threading.Thread(target=_listen, args=(w, s), daemon=True).start()
    if args.ready_fd >= 0:
        os.write(args.ready_fd, (json.dumps({"socket": args.socket, "listen": listen}) + "\n").encode())
        os.close(args.ready_fd)
    parent = os.getppid()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.wait(0.5):
        if os.getppid() != parent:  # the daemon is gone
            break
    for s in servers:
        s.close()
    try:
        os.unlink(args.socket)
    except OSError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
