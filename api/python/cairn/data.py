"""Datasets stored in cairn (docs/near.md).

A dataset is stored like a model: one cairn model whose tensors are the input shards (``x/00000``,
``x/00001``, ... e.g. N x C x H x W uint8 images) and their labels (``y/00000``, ...), with the same
chunking, tiers, peers, lineage and durability as any model. Its metadata (``"cairn.dataset"``) says
how many shards and samples there are, the per-sample shapes and dtypes, and each shard's content
hash, which keys the activation cache of near-data feature extraction (:mod:`cairn.near`).

    import cairn, cairn.data
    c = cairn.connect()
    cairn.data.save("cifar-like", ((x, y) for x, y in shards), client=c)
    ds = cairn.data.Dataset("cifar-like", client=c)          # map-style: ds[i] -> (x_i, y_i)
    for x, y in cairn.data.ShardDataset("cifar-like", client=c):   # one shard per item
        ...

Reads are zero-copy: the tensors are read-only views of the daemon's shared arena (leased while
alive), wrapped as torch tensors without a copy.
"""
from __future__ import annotations

import hashlib
import warnings
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset as _TorchDataset
from torch.utils.data import IterableDataset as _TorchIterableDataset

from .client import Client, connect

META_KEY = "cairn.dataset"


def x_name(i: int) -> str:
    return f"x/{i:05d}"


def y_name(i: int) -> str:
    return f"y/{i:05d}"


def shard_hash(x: np.ndarray, y: Optional[np.ndarray]) -> str:
    """The content hash of one shard (its inputs, shape and dtype, and labels): hex BLAKE2b-128."""
    h = hashlib.blake2b(digest_size=16)
    for a in (x, y):
        if a is None:
            h.update(b"none")
            continue
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(memoryview(a).cast("B"))
    return h.hexdigest()


def _numpy(v: Any, what: str) -> np.ndarray:
    if hasattr(v, "detach") and hasattr(v, "numpy"):  # a torch tensor
        v = v.detach().cpu().numpy()
    a = np.asarray(v)
    if a.ndim == 0:
        raise ValueError(f"{what}: a shard must have a leading sample dimension, got a scalar")
    return a


def save(id: str, shards: Iterable[Tuple[Any, Any]], *, client: Optional[Client] = None,
         parent: Optional[str] = None, meta: Optional[Mapping[str, Any]] = None,
         durability: str = "global") -> Dict[str, Any]:
    """Stores ``shards`` (an iterable of ``(x, y)``: inputs with a leading sample dimension and their
    labels, numpy arrays or torch tensors; ``y`` may be None) as dataset ``id``, and returns its
    ``cairn.dataset`` metadata. Every shard must have the same per-sample shape and dtype."""
    c = client or connect()
    tensors: Dict[str, np.ndarray] = {}
    sizes: List[int] = []
    hashes: List[str] = []
    xspec = yspec = None
    for i, (x, y) in enumerate(shards):
        xa = _numpy(x, f"shard {i} inputs")
        ya = None if y is None else _numpy(y, f"shard {i} labels")
        if ya is not None and ya.shape[0] != xa.shape[0]:
            raise ValueError(f"shard {i}: {xa.shape[0]} inputs but {ya.shape[0]} labels")
        spec = {"dtype": xa.dtype.str, "shape": list(xa.shape[1:])}
        if xspec is None:
            xspec = spec
        elif spec != xspec:
            raise ValueError(f"shard {i}: inputs of {spec}, but shard 0 has {xspec}")
        if ya is not None:
            s = {"dtype": ya.dtype.str, "shape": list(ya.shape[1:])}
            if yspec is None and i == 0:
                yspec = s
            elif s != yspec:
                raise ValueError(f"shard {i}: labels of {s}, but shard 0 has {yspec}")
        elif i > 0 and yspec is not None:
            raise ValueError(f"shard {i} has no labels, but shard 0 has")
        tensors[x_name(i)] = np.ascontiguousarray(xa)
        if ya is not None:
            tensors[y_name(i)] = np.ascontiguousarray(ya)
        sizes.append(int(xa.shape[0]))
        hashes.append(shard_hash(xa, ya))
    if not sizes:
        raise ValueError(f"dataset {id!r}: no shards")
    info = {"shards": len(sizes), "samples": int(sum(sizes)), "sizes": sizes, "hashes": hashes,
            "x": xspec, "y": yspec}
    m = dict(meta or {})
    m[META_KEY] = info
    c.save_model(id, tensors, parent=parent, meta=m, durability=durability, wait=True)
    return info


def info(id: str, client: Optional[Client] = None) -> Dict[str, Any]:
    """The ``cairn.dataset`` metadata of dataset ``id``; ValueError if ``id`` is a model, not a dataset."""
    c = client or connect()
    shown = c.show(id)
    m = shown.get("meta") or shown.get("metadata") or {}
    if META_KEY not in m:
        raise ValueError(f"{id!r} is not a cairn dataset (its metadata has no {META_KEY!r}; store one with cairn.data.save)")
    return m[META_KEY]


def _torch_view(a: np.ndarray) -> Any:
    with warnings.catch_warnings():  # the arena view is read-only; the tensor must not be written
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(a)


def read_shard(c: Client, id: str, i: int, labels: bool = True) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """Shard ``i`` of dataset ``id`` as read-only numpy views of the arena (no copy)."""
    names = [x_name(i)] + ([y_name(i)] if labels else [])
    got = c.load_model(id, names=names)
    return got[x_name(i)], got.get(y_name(i)) if labels else None


class ShardDataset(_TorchIterableDataset):
    """A torch ``IterableDataset`` over a stored dataset's shards: each item is
    ``(x, y)`` for one whole shard, as read-only torch tensors over the arena (zero-copy).
    ``shards`` picks and orders the shards (default: all, in order)."""

    def __init__(self, id: str, client: Optional[Client] = None, shards: Optional[Sequence[int]] = None) -> None:
        self.id = id
        self._client = client
        self.info = info(id, self.client)
        n = self.info["shards"]
        self.shards = list(range(n)) if shards is None else [int(s) for s in shards]
        for s in self.shards:
            if not 0 <= s < n:
                raise IndexError(f"dataset {id!r} has shards 0..{n - 1}, not {s}")

    @property
    def client(self) -> Client:
        if self._client is None:  # each DataLoader worker process connects on first use
            self._client = connect()
        return self._client

    def __len__(self) -> int:
        return len(self.shards)

    def __iter__(self) -> Iterator[Tuple[Any, Any]]:
        has_y = self.info.get("y") is not None
        for s in self.shards:
            x, y = read_shard(self.client, self.id, s, labels=has_y)
            yield _torch_view(x), (_torch_view(y) if y is not None else None)

    def __getstate__(self) -> Dict[str, Any]:  # picklable for DataLoader workers: no connection
        d = dict(self.__dict__)
        d["_client"] = None
        return d


class Dataset(_TorchDataset):
    """A torch map-style ``Dataset`` over a stored dataset: ``ds[i]`` is sample ``i`` as ``(x, y)``
    read-only torch tensors (views of the shard in the arena; the shard stays leased while a view of
    it is alive). ``len(ds)`` is the number of samples."""

    def __init__(self, id: str, client: Optional[Client] = None) -> None:
        self.id = id
        self._client = client
        self.info = info(id, self.client)
        self._starts = np.cumsum([0] + list(self.info["sizes"]))
        self._cached: Tuple[int, Any, Any] = (-1, None, None)

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = connect()
        return self._client

    def __len__(self) -> int:
        return int(self._starts[-1])

    def locate(self, i: int) -> Tuple[int, int]:
        """(shard, index within the shard) of sample ``i``."""
        if not -len(self) <= i < len(self):
            raise IndexError(f"dataset {self.id!r} has {len(self)} samples, not index {i}")
        i %= len(self)
        s = int(np.searchsorted(self._starts, i, side="right") - 1)
        return s, i - int(self._starts[s])

    def __getitem__(self, i: int) -> Tuple[Any, Any]:
        s, k = self.locate(int(i))
        if self._cached[0] != s:
            x, y = read_shard(self.client, self.id, s, labels=self.info.get("y") is not None)
            self._cached = (s, _torch_view(x), _torch_view(y) if y is not None else None)
        _, x, y = self._cached
        return x[k], (y[k] if y is not None else None)

    def __getstate__(self) -> Dict[str, Any]:
        d = dict(self.__dict__)
        d["_client"] = None
        d["_cached"] = (-1, None, None)
        return d


def synthetic_images(samples: int, shard: int, shape: Sequence[int] = (3, 224, 224), classes: int = 10,
                     seed: int = 0) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """A synthetic image set made on the spot (for examples, tests and benchmarks): shards of up to
    ``shard`` uint8 images of ``shape`` with int64 labels in [0, classes); each class has its own mean
    colour, so a classifier can learn something."""
    rng = np.random.default_rng(seed)
    means = rng.integers(40, 216, size=(classes, shape[0]))
    done = 0
    while done < samples:
        n = min(shard, samples - done)
        y = rng.integers(0, classes, size=n).astype(np.int64)
        noise = rng.integers(-40, 40, size=(n, *shape), dtype=np.int16)
        x = (means[y].reshape(n, shape[0], *([1] * (len(shape) - 1))) + noise).clip(0, 255).astype(np.uint8)
        yield x, y
        done += n
