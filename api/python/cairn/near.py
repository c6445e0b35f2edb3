"""Near-data feature extraction (docs/near.md): run a stored model's frozen first layers next to the
data, in the daemon's compute worker, and train on the activations instead of the raw inputs.

    import cairn.near as near
    near.save(resnet, "r50", frozen=9, builder="torchvision.models:resnet50")   # once
    stream = near.features("r50", "images", split="auto")
    frozen_rest, trainable = stream.remainder()
    for acts, labels in stream:             # the inputs of layer `stream.split`, one shard at a time
        loss = criterion(trainable(frozen_rest(acts)), labels)
        ...

A model is seen as a list of layers (:func:`layers`: an ``nn.Sequential``'s children, torchvision's
ResNet and VGG unrolled, or a module's own ``cairn_layers()``); the first ``frozen`` of them are not
trained. The split ``k`` (0 <= k <= frozen) sends the output of layer ``k - 1`` over the link
(``k = 0``: the raw inputs, HAPI's "vanilla"). ``split="auto"`` lets :func:`choose_split` pick it from
a profiling pass on both sides and the measured link bandwidth. Activations are cached in cairn,
keyed by the signature of the prefix (its layers and their weights), the shard's content hash and
the preprocessing, so every model with the same frozen prefix reads them instead of recomputing.
"""
from __future__ import annotations

import hashlib
import importlib
import json
import os
import queue
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import nn

from . import _near_wire as wire
from . import data as _data
from .client import Client, connect

META_KEY = "cairn.near"
DEFAULT_PREP: Dict[str, Any] = {"scale": 1.0 / 255.0}


class NearError(Exception):
    """A near-data request the worker refused (the message is the worker's)."""


# ---- a model as a list of layers, its prefix signatures, and how to rebuild it ----

def layers(module: nn.Module) -> List[nn.Module]:
    """The module as a list of layers whose composition in order is its forward pass: its own
    ``cairn_layers()``, an ``nn.Sequential``'s children, or torchvision's ResNet/VGG unrolled."""
    own = getattr(module, "cairn_layers", None)
    if callable(own):
        return list(own())
    if isinstance(module, nn.Sequential):
        return list(module.children())
    try:
        from torchvision.models import VGG, ResNet
    except ImportError:  # pragma: no cover - torchvision is a dependency of the tests
        VGG = ResNet = ()  # type: ignore
    if ResNet and isinstance(module, ResNet):
        m = module
        return [m.conv1, m.bn1, m.relu, m.maxpool, m.layer1, m.layer2, m.layer3, m.layer4, m.avgpool,
                nn.Flatten(1), m.fc]
    if VGG and isinstance(module, VGG):
        return [*module.features, module.avgpool, nn.Flatten(1), *module.classifier]
    raise TypeError(f"cairn.near cannot split a {type(module).__name__}: give it a cairn_layers() method returning "
                    "its layers in forward order, or use an nn.Sequential")


def _tensor_digest(h: "hashlib._Hash", name: str, t: torch.Tensor) -> None:
    t = t.detach().cpu().contiguous()
    h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")


def signatures(module: nn.Module, upto: Optional[int] = None) -> List[str]:
    """sig[k] for k = 0..upto: the stable signature of the first k layers (each layer's description
    and its parameters' and buffers' bytes, chained), hex BLAKE2b-128. Two models whose first k
    layers are equal in structure and weights have equal sig[k]."""
    ls = layers(module)
    upto = len(ls) if upto is None else upto
    sig = hashlib.blake2b(b"cairn.near prefix v1", digest_size=16).hexdigest()
    out = [sig]
    for layer in ls[:upto]:
        h = hashlib.blake2b(digest_size=16)
        h.update(sig.encode())
        h.update(repr(layer).encode())
        for name, t in layer.state_dict().items():
            if not name.endswith("num_batches_tracked"):  # a training counter: no effect on the outputs
                _tensor_digest(h, name, t)
        sig = h.hexdigest()
        out.append(sig)
    return out


def _builder_name(builder: Union[str, Callable[..., nn.Module]]) -> str:
    if isinstance(builder, str):
        if ":" not in builder:
            raise ValueError(f"builder {builder!r}: expected 'module:callable', such as 'torchvision.models:resnet50'")
        return builder
    return f"{builder.__module__}:{builder.__qualname__}"


def build(spec: Mapping[str, Any]) -> nn.Module:
    """A new module from a model's ``cairn.near`` metadata (its builder called with its kwargs)."""
    name = spec.get("builder")
    if not isinstance(name, str) or ":" not in name:
        raise ValueError(f"cairn.near metadata has no builder 'module:callable' (got {name!r})")
    mod, _, attr = name.partition(":")
    obj: Any = importlib.import_module(mod)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj(**dict(spec.get("kwargs") or {}))


def save(module: nn.Module, id: str, *, frozen: int, builder: Union[str, Callable[..., nn.Module]],
         kwargs: Optional[Mapping[str, Any]] = None, client: Optional[Client] = None, parent: Optional[str] = None,
         meta: Optional[Mapping[str, Any]] = None, durability: str = "global") -> Dict[str, Any]:
    """Stores ``module`` as model ``id`` (through :func:`cairn.torch.save`, so tensors equal to the
    parent's are inherited) with what near-data extraction needs: how to rebuild it (``builder``
    called with ``kwargs``), how many of its first layers are frozen, and the prefix signatures."""
    from . import torch as ctorch
    n = len(layers(module))
    if not 0 <= frozen <= n:
        raise ValueError(f"frozen={frozen}: the model has {n} layers")
    spec = {"builder": _builder_name(builder), "kwargs": dict(kwargs or {}), "frozen": int(frozen), "layers": n,
            "signatures": signatures(module, frozen)}
    json.dumps(spec)  # kwargs must be JSON
    m = dict(meta or {})
    m[META_KEY] = spec
    ctorch.save(module, id, parent=parent, meta=m, client=client, durability=durability)
    return spec


def spec_of(c: Client, id: str) -> Dict[str, Any]:
    m = c.show(id).get("metadata") or {}
    if META_KEY not in m:
        raise ValueError(f"model {id!r} has no {META_KEY!r} metadata: store it with cairn.near.save")
    return m[META_KEY]


def load_module(c: Client, id: str, spec: Optional[Mapping[str, Any]] = None) -> nn.Module:
    """Model ``id`` rebuilt from its builder with its stored weights, in eval mode."""
    from . import torch as ctorch
    module = build(spec or spec_of(c, id))
    ctorch.load(id, module, client=c)
    return module.eval()


# ---- preprocessing ----

def prep_key(prep: Mapping[str, Any]) -> str:
    return hashlib.blake2b(json.dumps(dict(prep), sort_keys=True).encode(), digest_size=8).hexdigest()


def preprocess(x: torch.Tensor, prep: Mapping[str, Any]) -> torch.Tensor:
    """The float32 input of layer 0 from raw shard inputs: ``x * scale``, then ``(x - mean) / std``
    per channel when given. The worker and the trainer use this same function."""
    y = x.to(torch.float32)
    scale = prep.get("scale")
    if scale is not None:
        y = y * float(scale)
    mean, std = prep.get("mean"), prep.get("std")
    if mean is not None:
        shape = (1, -1) + (1,) * (y.dim() - 2)
        y = (y - torch.tensor(mean, dtype=torch.float32).view(shape)) / torch.tensor(
            std if std is not None else [1.0] * len(mean), dtype=torch.float32).view(shape)
    return y


def run_layers(ls: Sequence[nn.Module], x: torch.Tensor, batch: Optional[int] = None) -> torch.Tensor:
    """The layers applied in inference mode, ``batch`` samples at a time (all at once by default)."""
    with torch.inference_mode():
        if not batch or batch >= x.shape[0]:
            for layer in ls:
                x = layer(x)
            return x
        parts = []
        for i in range(0, x.shape[0], batch):
            y = x[i:i + batch]
            for layer in ls:
                y = layer(y)
            parts.append(y)
        return torch.cat(parts)


# ---- the cost model ----

@dataclass
class Plan:
    """What :func:`choose_split` decided, and its estimate for every split (seconds per sample)."""
    split: int
    estimate: float
    table: List[Dict[str, Any]] = field(default_factory=list)
    bandwidth: float = 0.0


def choose_split(*, worker: Sequence[float], trainer: Sequence[float], head: float, out_bytes: Sequence[int],
                 bandwidth: float, frozen: int, mem_fixed: Sequence[int], mem_per_sample: Sequence[int],
                 memory: int, cached: Sequence[bool] = (), epochs: int = 1, samples: int = 0,
                 cache_bytes: int = 0) -> Plan:
    """The split k in [0, frozen] that minimises the estimated time per sample.

    ``worker[i]`` / ``trainer[i]``: seconds per sample of layer i's forward pass on each side;
    ``head``: seconds per sample of the trainable layers' forward and backward on the trainer;
    ``out_bytes[k]``: bytes per sample crossing the link at split k (``out_bytes[0]``: raw inputs);
    ``bandwidth``: bytes/s of the link; ``mem_fixed[k] + b * mem_per_sample[k]``: the worker's memory
    for a batch of b at split k, which must fit ``memory`` for b >= 1; ``cached[k]``: activations at
    k are already stored (no worker compute). Requests are pipelined, so a sample costs the slowest
    of the three stages: max(worker, link, trainer).

    ``epochs``: passes the trainer will make over the dataset. After the first, the activations at
    k are cached (when ``samples * out_bytes[k]`` fits ``cache_bytes``; 0 = assume they fit), so
    later epochs cost max(link, trainer) -- cairn's cache, which HAPI does not have, can make a
    split past the balanced one pay off. The estimate is the mean time per sample and epoch."""
    if not 0 <= frozen < len(out_bytes):
        raise ValueError(f"frozen={frozen} with {len(out_bytes)} split points")
    best: Optional[Tuple[float, int]] = None
    table = []
    for k in range(frozen + 1):
        is_cached = k < len(cached) and bool(cached[k])
        w = 0.0 if (k == 0 or is_cached) else float(sum(worker[:k]))
        n = out_bytes[k] / bandwidth if bandwidth > 0 else 0.0
        t = float(sum(trainer[k:frozen])) + head
        fits = k == 0 or is_cached or mem_fixed[k] + mem_per_sample[k] <= memory
        keeps = k > 0 and (cache_bytes <= 0 or samples * out_bytes[k] <= cache_bytes)
        later = max(n, t) if keeps else max(w, n, t)
        est = (max(w, n, t) + (max(1, epochs) - 1) * later) / max(1, epochs)
        table.append({"split": k, "worker_s": w, "link_s": n, "trainer_s": t, "estimate_s": est,
                      "bytes": int(out_bytes[k]), "fits": fits, "cached": is_cached})
        if fits and (best is None or est < best[0] * (1 - 1e-9) or (abs(est - best[0]) <= 1e-12 and out_bytes[k] <
                                                                     out_bytes[best[1]])):
            best = (est, k)
    assert best is not None  # k = 0 always fits
    return Plan(split=best[1], estimate=best[0], table=table, bandwidth=bandwidth)


def worker_batch(memory: int, free: int, fixed: int, per_sample: int, cap: int) -> int:
    """The worker's batch: as many samples as its budget (the smaller of ``memory`` and the free
    memory) holds after the prefix's weights, at least 1 and at most ``cap``."""
    room = min(memory, free) - fixed
    return max(1, min(cap, room // max(1, per_sample)))


def profile_layers(ls: Sequence[nn.Module], x: torch.Tensor,
                   repeats: int = 1) -> Tuple[List[float], List[int], torch.Tensor]:
    """Seconds per sample of each layer's forward pass (the best of ``repeats`` after a warm-up),
    the bytes per sample of each layer's output, and the last layer's output, on input batch ``x``."""
    n = x.shape[0]
    times = [float("inf")] * len(ls)
    sizes = [0] * len(ls)
    y = x
    with torch.inference_mode():
        for r in range(repeats + 1):
            y = x
            for i, layer in enumerate(ls):
                t0 = time.perf_counter()
                y = layer(y)
                dt = time.perf_counter() - t0
                if r > 0:
                    times[i] = min(times[i], dt / n)
                sizes[i] = y.element_size() * y[0].numel()
    return times, sizes, y


def memory_model(ls: Sequence[nn.Module], in_bytes: int, sizes: Sequence[int]) -> Tuple[List[int], List[int]]:
    """For each split k: (the prefix's weight bytes, the bytes a sample needs while the prefix runs:
    the largest input + output of one layer, float32 input included)."""
    fixed, per = [0], [in_bytes]
    w = 0
    prev = in_bytes * 4  # the float32 copy of the raw input
    peak = 0
    for i, layer in enumerate(ls):
        w += sum(t.numel() * t.element_size() for t in layer.state_dict().values())
        peak = max(peak, prev + sizes[i])
        prev = sizes[i]
        fixed.append(w)
        per.append(peak)
    return fixed, per


# ---- the client: an iterator of activation batches ----

def worker_address(c: Client, address: Optional[str] = None) -> Tuple[str, bool]:
    """Where the compute worker listens and whether it shares this client's arena: ``address``, else
    ``$CAIRN_COMPUTE_ADDRESS`` (a worker on another node, ``HOST:PORT``), else the local daemon's
    worker (started on demand; Unavailable when ``compute.enabled`` is off)."""
    if address:
        return address, False
    env = os.environ.get("CAIRN_COMPUTE_ADDRESS")
    if env:
        return env, False
    r = c._request({"op": "compute"})
    return str(r["socket"]), True


def request(address: str, req: Mapping[str, Any], timeout: Optional[float] = 60.0) -> Dict[str, Any]:
    """One request/reply exchange with a worker on a connection of its own (hello, profile, stats)."""
    s = wire.connect(address, timeout)
    try:
        s.settimeout(timeout)
        wire.send(s, dict(req))
        h, _ = wire.recv(s)
    finally:
        s.close()
    if "error" in h:
        raise NearError(str(h["error"]))
    return h


def worker_stats(client: Optional[Client] = None, address: Optional[str] = None) -> Dict[str, Any]:
    """The worker's counters: forward passes per (prefix, shard), cache hits and misses, bytes sent."""
    addr, _ = worker_address(client or connect(), address)
    return request(addr, {"op": "stats"})


def drop_cache(signature: str = "", client: Optional[Client] = None, address: Optional[str] = None) -> int:
    """Removes the worker's cached activations of the prefix ``signature`` ("" = all); returns how many."""
    addr, _ = worker_address(client or connect(), address)
    return int(request(addr, {"op": "drop", "signature": signature})["dropped"])


def _array(view: memoryview, spec: Mapping[str, Any]) -> np.ndarray:
    return np.frombuffer(view, dtype=np.dtype(spec["dtype"])).reshape(spec["shape"])


def _as_tensor(a: np.ndarray) -> torch.Tensor:
    with warnings.catch_warnings():  # arena views are read-only; the tensors must not be written
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(a)


_profiles: Dict[Tuple[str, str, str, str], Dict[str, Any]] = {}


class Features:
    """The activations of ``model``'s layers ``[0, split)`` on ``dataset``, one shard (or ``batch``
    samples) at a time: iterating yields ``(inputs_of_layer_split, labels)`` as torch tensors. The
    requests for consecutive shards are pipelined (``depth`` shards ahead), so the worker computes
    and the link carries while the trainer trains. If the worker dies or cannot be reached, the rest
    is computed here, with a warning. See the module docstring."""

    def __init__(self, model: str, dataset: str, split: Union[int, str] = "auto", batch: Optional[int] = None, *,
                 shards: Optional[Sequence[int]] = None, prep: Optional[Mapping[str, Any]] = None,
                 client: Optional[Client] = None, address: Optional[str] = None, module: Optional[nn.Module] = None,
                 depth: int = 2, profile_samples: int = 2, timeout: float = 60.0, epochs: int = 1) -> None:
        self.client = client or connect()
        c = self.client
        self.model, self.dataset, self.batch, self.depth = model, dataset, batch, max(1, depth)
        self.epochs = max(1, int(epochs))
        self.spec = spec_of(c, model)
        self.frozen = int(self.spec["frozen"])
        self.info = _data.info(dataset, c)
        self.prep = dict(prep or DEFAULT_PREP)
        self.module = module if module is not None else load_module(c, model, self.spec)
        self.layers = layers(self.module)
        n = self.info["shards"]
        self.shards = list(range(n)) if shards is None else [int(s) for s in shards]
        for s in self.shards:
            if not 0 <= s < n:
                raise IndexError(f"dataset {dataset!r} has shards 0..{n - 1}, not {s}")
        self.stats: Dict[str, Any] = {"bytes": 0, "shards": 0, "cached": 0, "computed": 0, "local": 0,
                                      "fallback": None, "wait_s": 0.0}
        self.plan: Optional[Plan] = None
        self.timeout = timeout
        self._sock = None
        self.address, self.local = "", False
        try:
            self.address, self.local = worker_address(c, address)
            self._sock = wire.connect(self.address, timeout)
        except Exception as e:  # noqa: BLE001 - no worker: every layer runs here
            self._fail(e)
        if split == "auto":
            self.split = self._choose(profile_samples) if self._sock is not None else self.frozen
        else:
            self.split = int(split)
            if not 0 <= self.split <= self.frozen:
                raise ValueError(f"split {self.split}: model {model!r} has {self.frozen} frozen layers (0..{self.frozen})")

    def _fail(self, e: BaseException) -> None:
        self.stats["fallback"] = f"{type(e).__name__}: {e}"
        warnings.warn(f"cairn.near: the compute worker failed ({type(e).__name__}: {e}); running every layer here",
                      RuntimeWarning, stacklevel=3)
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def remainder(self) -> Tuple[nn.Sequential, nn.Sequential]:
        """The layers the trainer runs: (``[split, frozen)`` in eval mode, ``[frozen, end)`` to train)."""
        return nn.Sequential(*self.layers[self.split:self.frozen]).eval(), nn.Sequential(*self.layers[self.frozen:])

    # -- the split --

    def trainer_profile(self, samples: int) -> Tuple[List[float], float]:
        """Seconds per sample of each frozen layer here, and of the trainable layers' forward and
        backward, on ``samples`` synthetic inputs of the dataset's shape."""
        x = torch.zeros((samples, *self.info["x"]["shape"]), dtype=torch.from_numpy(
            np.zeros(0, np.dtype(self.info["x"]["dtype"]))).dtype)
        xin = preprocess(x, self.prep)
        times, _, feats = profile_layers(self.layers[:self.frozen], xin)
        head = nn.Sequential(*self.layers[self.frozen:])
        best = float("inf")
        for r in range(2):
            t0 = time.perf_counter()
            out = head(feats.clone())
            out.float().sum().backward()
            if r:
                best = min(best, (time.perf_counter() - t0) / samples)
        head.zero_grad(set_to_none=True)
        return times, best

    def bandwidth(self) -> float:
        """The link's bytes/s to the worker, the better of two timed echoes of 1 and 4 MiB (0 = it shares
        this node's arena: no link)."""
        if self.local or self._sock is None:
            return 0.0
        best = 0.0
        for size in (1 << 20, 4 << 20):
            t0 = time.perf_counter()
            wire.send(self._sock, {"op": "echo", "size": size})
            h, p = wire.recv(self._sock)
            best = max(best, size / (time.perf_counter() - t0))
        return best

    def _choose(self, samples: int) -> int:
        # The profiles of both sides and the link are measured once per process for a model, dataset
        # and worker; a later stream only asks which splits are cached now (samples = 0).
        key = (self.model, self.dataset, self.address, json.dumps(self.prep, sort_keys=True))
        known = _profiles.get(key)
        try:
            self._sock.settimeout(self.timeout)
            wire.send(self._sock, {"op": "profile", "model": self.model, "dataset": self.dataset,
                                   "samples": 0 if known else samples, "prep": self.prep, "shards": self.shards})
            w, _ = wire.recv(self._sock)
            if "error" in w:
                raise NearError(str(w["error"]))
            if known is None:
                bw = self.bandwidth()
            self._sock.settimeout(None)
        except (OSError, ConnectionError, wire.ProtocolError) as e:
            self._fail(e)
            return self.frozen
        if known is None:
            trainer, head = self.trainer_profile(samples)
            known = _profiles[key] = {**w, "trainer": trainer, "head": head, "bandwidth": bw}
        n = sum(self.info["sizes"][s] for s in self.shards)
        self.plan = choose_split(worker=known["seconds"], trainer=known["trainer"], head=known["head"],
                                 out_bytes=known["out_bytes"], bandwidth=known["bandwidth"], frozen=self.frozen,
                                 mem_fixed=known["mem_fixed"], mem_per_sample=known["mem_per_sample"],
                                 memory=min(known["memory"], w["free"]), cached=w["cached"], epochs=self.epochs,
                                 samples=n, cache_bytes=int(w.get("cache", 0)))
        return self.plan.split

    # -- iteration --

    def _reader(self, q: "queue.Queue[Any]") -> None:
        try:
            while True:
                h, payload = wire.recv(self._sock)
                q.put((h, payload))
                if "error" in h or h.get("done"):
                    return
        except BaseException as e:  # noqa: BLE001 - handed to the iterating thread
            q.put(e)

    def _decode(self, h: Mapping[str, Any], payload: memoryview) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        c = self.client
        s = int(h["shard"])
        self.stats["bytes"] += payload.nbytes
        self.stats["cached" if h.get("cached") else "computed"] += 1 if self.split else 0
        if "model" in h:  # activations in the shared arena
            acts = _as_tensor(c.load_model(h["model"], names=["a"])["a"])
            y = _data.read_shard(c, self.dataset, s)[1] if self.info.get("y") else None
        elif "dataset" in h:  # split 0 on this node: the raw shard from the arena
            x, y = _data.read_shard(c, self.dataset, s, labels=bool(self.info.get("y")))
            acts = preprocess(_as_tensor(x), self.prep)
        else:
            specs = h.get("arrays") or []
            if not specs:
                raise wire.ProtocolError(f"shard {s}: a reply with neither arrays nor a model")
            arrays, off = [], 0
            for spec in specs:
                n = int(np.prod(spec["shape"], dtype=np.int64)) * np.dtype(spec["dtype"]).itemsize
                if off + n > payload.nbytes:
                    raise wire.ProtocolError(f"shard {s}: arrays of more bytes than the {payload.nbytes}-byte payload")
                arrays.append(_array(payload[off:off + n], spec))
                off += n
            acts = torch.from_numpy(arrays[0]) if self.split else preprocess(torch.from_numpy(arrays[0]), self.prep)
            y = arrays[1] if len(arrays) > 1 else None
        return acts, (_as_tensor(y) if y is not None else None)

    def local_shard(self, s: int) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Shard ``s`` computed here: layers ``[0, split)`` on the raw shard read from this node's daemon."""
        x, y = _data.read_shard(self.client, self.dataset, s, labels=bool(self.info.get("y")))
        acts = run_layers(self.layers[:self.split], preprocess(torch.from_numpy(np.array(x)), self.prep))
        self.stats["local"] += 1
        return acts, (_as_tensor(y) if y is not None else None)

    def _by_shard(self) -> Iterator[Tuple[torch.Tensor, Optional[torch.Tensor]]]:
        done = 0
        if self._sock is not None:
            q: "queue.Queue[Any]" = queue.Queue(maxsize=self.depth)
            try:
                wire.send(self._sock, {"op": "features", "model": self.model, "dataset": self.dataset,
                                       "shards": self.shards, "split": self.split, "prep": self.prep,
                                       "local": self.local})
            except OSError as e:
                self._fail(e)
            else:
                threading.Thread(target=self._reader, args=(q,), daemon=True).start()
                while True:
                    t0 = time.perf_counter()
                    item = q.get()
                    self.stats["wait_s"] += time.perf_counter() - t0
                    if isinstance(item, BaseException):
                        self._fail(item)
                        break
                    h, payload = item
                    if "error" in h:
                        raise NearError(str(h["error"]))
                    if h.get("done"):
                        break
                    out = self._decode(h, payload)
                    done += 1
                    self.stats["shards"] += 1
                    yield out
        for s in self.shards[done:]:
            self.stats["shards"] += 1
            yield self.local_shard(s)

    def __iter__(self) -> Iterator[Tuple[torch.Tensor, Optional[torch.Tensor]]]:
        if not self.batch:
            yield from self._by_shard()
            return
        xs: List[torch.Tensor] = []
        ys: List[torch.Tensor] = []
        have = 0
        for a, y in self._by_shard():
            xs.append(a)
            if y is not None:
                ys.append(y)
            have += a.shape[0]
            while have >= self.batch:
                ax, ay = torch.cat(xs), (torch.cat(ys) if ys else None)
                yield ax[:self.batch], (ay[:self.batch] if ay is not None else None)
                xs, ys = [ax[self.batch:]], ([ay[self.batch:]] if ay is not None else [])
                have -= self.batch
        if have:
            yield torch.cat(xs), (torch.cat(ys) if ys else None)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> "Features":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def features(model: str, dataset: str, split: Union[int, str] = "auto", batch: Optional[int] = None,
             **kw: Any) -> Features:
    """An iterator of ``(activations, labels)``: see :class:`Features`."""
    return Features(model, dataset, split, batch, **kw)
