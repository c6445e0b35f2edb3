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
  drop {signature}               -> removes the cached activations of a prefix ("" = all)
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
from ._errors import NotFound
from .client import Client, connect

ACT_PREFIX = "cairn-act-"


def act_id(sig: str, shard_hash: str, prep: str) -> str:
    """The cache key of the activations of prefix ``sig`` on a shard with a preprocessing. The model
    that holds them is ``<key>-<generation>``: a removed model's id stays taken until gc, so
    activations computed again after a removal are stored under a new generation."""
    return f"{ACT_PREFIX}{sig[:20]}-{shard_hash[:20]}-{prep}"


def _key_of(model_id: str) -> str:
    return model_id.rsplit("-", 1)[0]


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
        # cache key -> (prefix signature, bytes, the model holding them), least recently used first
        self.acts: "collections.OrderedDict[str, Tuple[str, int, str]]" = collections.OrderedDict()
        self.act_bytes = 0
        c = self.client()
        if cache <= 0:
            cache = int(c.stats()["tiers"]["dram"].get("capacity_bytes", 1 << 30)) // 4
        self.cache = cache
        self.forward: Dict[str, int] = collections.Counter()  # "sig/shard" -> forward passes
        self.counters = collections.Counter()
        self.known: Dict[str, List[str]] = {}  # model id -> its prefix signatures ([] = not near)
        self.profiles: Dict[Tuple[Any, ...], Dict[str, Any]] = {}  # the profile op's measurements
        self.last_sweep = 0.0
        for m in c.list():  # activations a previous worker left (live ones: removed ones are not listed)
            mid = m["id"]
            if mid.startswith(ACT_PREFIX) and _key_of(mid) not in self.acts:
                self.acts[_key_of(mid)] = (mid[len(ACT_PREFIX):len(ACT_PREFIX) + 20], int(m.get("bytes", 0)), mid)
                self.act_bytes += int(m.get("bytes", 0))

    def client(self) -> Client:
        c = getattr(self.local, "c", None)
        if c is None:
            c = self.local.c = connect(self.daemon)
        return c

    # ---- models and the activation cache ----

    def prefix(self, model: str, split: int) -> Tuple[Dict[str, Any], List[torch.nn.Module]]:
        if split == 0:  # the raw inputs: no layer runs here, so the model is not loaded
            spec = near.spec_of(self.client(), model)
            return spec, []
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

    def _load(self, c: Client, key: str) -> Optional[np.ndarray]:
        """The cached activations of ``key`` (a view of the arena), or None when there are none or
        they were removed behind the index's back (then they are computed again)."""
        mid = self.cached(key)
        if mid is None:
            return None
        try:
            return c.load_model(mid, names=["a"])["a"]
        except NotFound:
            with self.mu:
                if key in self.acts and self.acts[key][2] == mid:
                    self.act_bytes -= self.acts.pop(key)[1]
            return None

    def cached(self, key: str) -> Optional[str]:
        """The model holding the activations of ``key``, or None."""
        with self.mu:
            got = self.acts.get(key)
            if got is None:
                return None
            self.acts.move_to_end(key)
            return got[2]

    def remember(self, c: Client, key: str, sig: str, nbytes: int, mid: str) -> None:
        drop = []
        with self.mu:
            old = self.acts.pop(key, None)
            if old is not None:
                self.act_bytes -= old[1]
                drop.append(old[2])
            self.acts[key] = (sig, nbytes, mid)
            self.act_bytes += nbytes
            while self.act_bytes > self.cache and len(self.acts) > 1:
                _, (_, b, victim) = self.acts.popitem(last=False)
                self.act_bytes -= b
                drop.append(victim)
        for victim in drop:
            self._remove(c, victim, "over compute.cache")

    def _remove(self, c: Client, aid: str, why: str) -> None:
        try:
            c.remove(aid)
            self.counters["activations_dropped"] += 1
        except Exception as e:  # already gone: nothing to do
            print(f"cairn near worker: dropping {aid} ({why}): {e}", file=sys.stderr)

    def sweep(self, c: Client) -> None:
        """Drops the activations of prefixes that no live model has (at most every
        $CAIRN_NEAR_SWEEP_S seconds, default 10)."""
        now = time.monotonic()
        if now - self.last_sweep < float(os.environ.get("CAIRN_NEAR_SWEEP_S", "10")):
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
            dead = [k for k, (sig, _, _) in self.acts.items() if sig not in live]
            gone = [self.acts.pop(k) for k in dead]
            self.act_bytes -= sum(b for _, b, _ in gone)
        for _, _, mid in gone:
            self._remove(c, mid, "no live model has its prefix")

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
        dinfo = _data.info(dataset, c)
        shards = req.get("shards") or list(range(dinfo["shards"]))
        pk = near.prep_key(prep)
        cached = [False] + [all(self.cached(act_id(spec["signatures"][k], dinfo["hashes"][s], pk)) is not None
                                for s in shards) for k in range(1, frozen + 1)]
        out = {"frozen": frozen, "memory": self.memory, "free": free_memory(), "cached": cached, "cache": self.cache}
        samples = int(req.get("samples", 4))
        if samples <= 0:  # the client has the profile: only what is cached now
            return out
        # Measured once per model, sample shape, preprocessing and sample count while this worker
        # lives: the next trainer of the same model (a NAS candidate's sibling, the next job step)
        # gets it without a pass.
        pkey = (model, tuple(dinfo["x"]["shape"]), dinfo["x"]["dtype"], pk, samples)
        with self.mu:
            known = self.profiles.get(pkey)
        if known is None:
            _, ls = self.prefix(model, frozen)
            x, _ = _data.read_shard(c, dataset, 0, labels=False)
            xin = near.preprocess(torch.from_numpy(np.array(x[:min(samples, x.shape[0])])), prep)
            with self.lock:
                times, sizes, _ = near.profile_layers(ls, xin)
            in_bytes = int(x[0].nbytes)
            fixed, per = near.memory_model(ls, in_bytes, sizes)
            known = {"seconds": times, "out_bytes": [in_bytes] + sizes, "mem_fixed": fixed, "mem_per_sample": per}
            with self.mu:
                self.profiles[pkey] = known
                self.counters["profiles"] += 1
        out.update(known)
        return out

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
            sh = dinfo["hashes"][s]
            key = act_id(sig, sh, pk)
            acts = None
            mid = self.cached(key)
            if mid is not None and not local:
                acts = self._load(c, key)
                if acts is None:
                    mid = None
            stored = hit = mid is not None
            if hit:
                self.counters["cache_hits"] += 1
                head["cached"] = True
            else:
                self.counters["cache_misses"] += 1
                # The longest shorter prefix with cached activations (a NAS candidate that froze
                # more layers than another): only the layers after it run.
                start, xin = 0, None
                for j in range(split - 1, 0, -1):
                    base = self._load(c, act_id(spec["signatures"][j], sh, pk))
                    if base is not None:
                        start, xin = j, torch.from_numpy(np.array(base))
                        self.counters["partial_hits"] += 1
                        break
                with self.lock:
                    if xin is None:
                        x, _ = _data.read_shard(c, dataset, s, labels=False)
                        xin = near.preprocess(torch.from_numpy(np.array(x)), prep)
                    if batch is None:
                        _, sizes, _ = near.profile_layers(ls[start:], xin[:1], repeats=0)
                        fixed, per = near.memory_model(ls[start:], xin[0].numel(), sizes)
                        batch = near.worker_batch(self.memory, free_memory(), fixed[-1], per[-1], xin.shape[0])
                    t0 = time.perf_counter()
                    out = near.run_layers(ls[start:], xin, batch).contiguous()
                    head["compute_s"] = time.perf_counter() - t0
                with self.mu:
                    self.forward[f"{sig[:20]}/{sh[:20]}"] += 1
                    self.counters["layer_passes"] += split - start
                acts = out.numpy()
                mid = f"{key}-{os.getpid():x}{time.time_ns():x}"
                try:
                    c.save_model(mid, {"a": acts}, durability="memory", wait=True,
                                 meta={"cairn.activations": {"signature": sig, "dataset": dataset, "shard": s,
                                                             "shard_hash": sh, "prep": prep,
                                                             "model": model, "split": split}})
                    self.remember(c, key, sig[:20], int(acts.nbytes), mid)
                    stored = True
                    try:  # a cache: its chunks leave DRAM first until read (with policy.eviction: hints)
                        c.hint("done", [mid])
                    except Exception:  # noqa: BLE001 - advice only
                        pass
                except Exception as e:  # noqa: BLE001 - a full arena: sent inline, not cached
                    print(f"cairn near worker: not caching {key}: {e}", file=sys.stderr)
                head["cached"] = False
            head["batch"] = batch
            if local and stored:
                head["model"] = mid
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

    def drop(self, sig: str) -> Dict[str, Any]:
        """Removes the cached activations of prefix ``sig`` (a prefix of its hex is enough; "" = all)."""
        c = self.client()
        with self.mu:
            keys = [k for k, (s, _, _) in self.acts.items() if s.startswith(sig[:20])]
            gone = [self.acts.pop(k) for k in keys]
            self.act_bytes -= sum(b for _, b, _ in gone)
        for _, _, mid in gone:
            self._remove(c, mid, "asked to")
        return {"dropped": len(gone)}

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
                    elif op == "drop":
                        wire.send(conn, self.drop(str(req.get("signature", ""))))
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
