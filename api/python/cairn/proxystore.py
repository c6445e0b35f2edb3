"""ProxyStore integration: ``CairnConnector`` keeps proxied objects in the node's cairnd (docs/workflows.md).

::

    from proxystore.store import Store
    import cairn.proxystore as cps

    store = Store("cairn", cps.CairnConnector(), serializer=cps.serialize, deserializer=cps.deserialize,
                  register=True)
    p = store.proxy(np.random.rand(4096, 2048))      # pass p to a Parsl app; it resolves there

How objects are stored
    Every object is a named tensor of the daemon (``kind="tensor"``, default: in the node's DRAM
    arena, never in the repository, gone when the daemon stops) or a one-tensor model
    (``kind="model"``: visible to every daemon of the job's peer group, committed at
    ``durability``). The key (:class:`CairnKey`) carries the name and how the bytes are to be
    given back, so any process that unpickles a proxy can resolve it through its own node's daemon.

Arrays without pickle
    ProxyStore serializes before it calls a connector, and its default serializer pickles torch
    tensors. So there are two paths:

    * ``serializer=cairn.proxystore.serialize, deserializer=cairn.proxystore.deserialize``
      (recommended): a numpy array or a CPU/GPU torch tensor becomes a small header object that
      *holds* the array (a ``bytes`` subclass: ProxyStore only checks that it is bytes-like); the
      connector stores the array's memory straight into the daemon's arena (the one copy of a put)
      with its dtype and shape, and a get hands back the array copied once out of the daemon. No
      pickle, no ``numpy.save`` buffer. bfloat16/FP8 tensors keep their dtype. Anything else falls
      back to ProxyStore's own serializer.
    * ProxyStore's default serializer: it writes numpy arrays with ``numpy.save`` (raw bytes after a
      header, no pickle for numeric dtypes); the connector recognises that layout and stores the
      array as a typed tensor too (readable as a tensor by other cairn clients), and gives the same
      bytes back. Torch tensors and other objects are pickled by ProxyStore and stored as ``U8`` bytes.

A key that does not exist (evicted, or the daemon restarted) gives ``None`` from ``get`` -- so a
proxy raises ProxyStore's ``ProxyResolveMissingKeyError``.
"""
from __future__ import annotations

import json
import os
import threading
import uuid
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Set, Tuple

import numpy as np

from . import _dtypes, _errors
from ._errors import CairnError

__all__ = ["CairnConnector", "CairnKey", "serialize", "deserialize"]

_NPY_TAG = b"NP\n"          # proxystore.serialize's identifier line for numpy.save'd arrays
_ARRAY_TAG = b"CA\n"        # this module's serializer: a header holding the array
_NPY_MAGIC = b"\x93NUMPY"
_DATA = "data"              # the tensor name of kind="model" objects


class CairnKey(NamedTuple):
    """Key of an object in cairn.

    Attributes:
        name: the named-tensor key (``kind == "tensor"``) or the model id (``kind == "model"``).
        form: how the stored tensor is given back: ``"numpy"``/``"torch"`` (an array of
            :func:`serialize`), ``"npy"`` (ProxyStore's numpy.save layout), ``"bytes"`` (U8 bytes).
        kind: ``"tensor"`` or ``"model"``.
    """

    name: str
    form: str
    kind: str = "tensor"


# ---- the serializer ----

class _ArrayPayload(bytes):
    """What :func:`serialize` gives ProxyStore for an array: bytes (a short JSON header, so that
    ProxyStore's checks and metrics see a bytes-like object) that also hold the array itself."""

    array: np.ndarray
    framework: str
    dtype: Optional[str]
    device: Optional[str]

    @classmethod
    def make(cls, array: np.ndarray, framework: str, dtype: Optional[str] = None,
             device: Optional[str] = None) -> "_ArrayPayload":
        head = {"framework": framework, "dtype": dtype or _dtypes.cairn_dtype(array.dtype), "shape": list(array.shape)}
        p = cls(_ARRAY_TAG + json.dumps(head).encode())
        p.array, p.framework, p.dtype, p.device = array, framework, dtype, device
        return p


def _torch_module(obj: Any) -> Any:
    t = type(obj)
    if t.__module__.startswith("torch"):
        import torch  # noqa: PLC0415

        if isinstance(obj, torch.Tensor):
            return torch
    return None


def _storable(a: np.ndarray) -> bool:
    try:
        _dtypes.cairn_dtype(a.dtype)
        return True
    except CairnError:
        return False


def serialize(obj: Any) -> bytes:
    """ProxyStore serializer: numpy arrays and torch tensors travel to the connector without a copy
    or pickle (see the module docstring); anything else as ``proxystore.serialize.serialize``.
    Use it only with a :class:`CairnConnector` store (another connector would keep only the header)."""
    if isinstance(obj, np.ndarray) and obj.dtype != object and _storable(obj):
        return _ArrayPayload.make(obj, "numpy")
    torch = _torch_module(obj)
    if torch is not None and obj.layout == torch.strided and not obj.is_quantized and not obj.is_complex():
        from . import _torch_dtypes  # noqa: PLC0415

        a, dt = _torch_dtypes.to_numpy("tensor", obj.contiguous())  # a CPU tensor's own memory (a copy only from a GPU)
        return _ArrayPayload.make(a, "torch", dt, str(obj.device))
    from proxystore.serialize import serialize as ps_serialize  # noqa: PLC0415

    return ps_serialize(obj)


def deserialize(data: Any) -> Any:
    """ProxyStore deserializer matching :func:`serialize`."""
    if isinstance(data, _ArrayPayload):
        if data.framework == "torch":
            from . import _torch_dtypes  # noqa: PLC0415

            t = _torch_dtypes.from_numpy("tensor", data.array, data.dtype or "")
            return t.to(data.device) if data.device and data.device != "cpu" else t
        return data.array
    if bytes(data[:3]) == _ARRAY_TAG:
        raise ValueError("cairn.proxystore.deserialize: this object was serialized for a CairnConnector "
                         "but read through another connector (only its header was stored)")
    from proxystore.serialize import deserialize as ps_deserialize  # noqa: PLC0415

    return ps_deserialize(data)


def _parse_npy(obj: Any) -> Optional[Tuple[np.ndarray, bytes]]:
    """(the array over obj's bytes, the npy prefix) when ``obj`` is ProxyStore's numpy.save layout of
    a C-ordered array of a dtype cairn stores; else None."""
    mv = memoryview(obj).cast("B")
    if len(mv) < 16 or bytes(mv[:3]) != _NPY_TAG or bytes(mv[3:9]) != _NPY_MAGIC:
        return None
    major = mv[9]
    if major == 1:
        hlen, start = int.from_bytes(mv[11:13], "little"), 13
    elif major in (2, 3):
        hlen, start = int.from_bytes(mv[11:15], "little"), 15
    else:
        return None
    try:
        import ast  # noqa: PLC0415

        head = ast.literal_eval(bytes(mv[start:start + hlen]).decode("latin1"))
        dtype = np.dtype(head["descr"])
        shape = tuple(int(x) for x in head["shape"])
        fortran = bool(head["fortran_order"])
    except (ValueError, SyntaxError, KeyError, TypeError):
        return None
    if fortran or dtype.hasobject or dtype.fields is not None:
        return None
    data_off = start + hlen
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(mv) - data_off != n:
        return None
    a = np.frombuffer(mv, np.uint8, count=n, offset=data_off).view(dtype).reshape(shape)
    if not _storable(a):
        return None
    return a, bytes(mv[:data_off])


# ---- the connector ----

class CairnConnector:
    """ProxyStore connector over the node's cairnd.

    Args:
        address: the daemon's socket; None (default): ``$CAIRN_SOCKET`` of whichever process uses the
            connector, else the default socket -- so a proxy resolves through the daemon of the node
            it lands on. (Given explicitly, every process uses that path.)
        kind: ``"tensor"`` (named tensors: node-local DRAM) or ``"model"`` (one-tensor models at
            ``durability``: visible to the whole peer group, kept in the repository at ``global``).
        prefix: prepended to every key / model id this connector makes.
        durability: for ``kind="model"``: ``"memory"`` (default), ``"local"`` or ``"global"``.
        clear: ``close()`` evicts the objects this connector instance put.

    Thread-safe (one connection per process, its calls serialised); after ``fork`` the child
    connects again.
    """

    def __init__(self, address: Optional[str] = None, *, kind: str = "tensor", prefix: str = "proxystore/",
                 durability: str = "memory", clear: bool = False) -> None:
        if kind not in ("tensor", "model"):
            raise ValueError(f"CairnConnector: kind {kind!r} is not 'tensor' or 'model'")
        if durability not in ("memory", "local", "global"):
            raise ValueError(f"CairnConnector: durability {durability!r} is not memory, local or global")
        self.address = address
        self.kind = kind
        self.prefix = prefix
        self.durability = durability
        self.clear = clear
        self._client: Any = None
        self._pid = -1
        self._lock = threading.Lock()
        self._mine: Set[CairnKey] = set()

    def __repr__(self) -> str:
        return f"CairnConnector(address={self.address!r}, kind={self.kind!r}, prefix={self.prefix!r})"

    def __enter__(self) -> "CairnConnector":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _c(self) -> Any:
        with self._lock:
            if self._client is None or self._pid != os.getpid() or self._client.closed:
                from .client import connect  # noqa: PLC0415

                self._client = connect(self.address)  # Unavailable names the socket
                self._pid = os.getpid()
            return self._client

    # -- protocol --

    def config(self) -> Dict[str, Any]:
        return {"address": self.address, "kind": self.kind, "prefix": self.prefix, "durability": self.durability,
                "clear": self.clear}

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> "CairnConnector":
        return cls(**config)

    def close(self, clear: Optional[bool] = None) -> None:
        """Evicts what this instance put when ``clear`` (default: the constructor's), then closes the
        connection. Idempotent."""
        if (self.clear if clear is None else clear):
            for k in list(self._mine):
                try:
                    self.evict(k)
                except CairnError:
                    pass
        with self._lock:
            if self._client is not None and self._pid == os.getpid():
                self._client.close()
            self._client = None

    def put(self, obj: Any) -> CairnKey:
        name = self.prefix + uuid.uuid4().hex
        if isinstance(obj, _ArrayPayload):
            key = CairnKey(name, obj.framework, self.kind)
            self._store(key, obj.array, obj.dtype)
        else:
            npy = _parse_npy(obj)
            if npy is not None:
                key = CairnKey(name, "npy", self.kind)
                self._store(key, npy[0], None)
            else:
                key = CairnKey(name, "bytes", self.kind)
                self._store(key, np.frombuffer(memoryview(obj).cast("B"), np.uint8), "U8")
        self._mine.add(key)
        return key

    def put_batch(self, objs: Sequence[Any]) -> List[CairnKey]:
        return [self.put(o) for o in objs]

    def get(self, key: CairnKey) -> Any:
        try:
            a, dtype = self._load(key)
        except _errors.NotFound:
            return None
        if key.form in ("numpy", "torch"):
            return _ArrayPayload.make(a, key.form, dtype)
        if key.form == "npy":
            from numpy.lib import format as npf  # noqa: PLC0415

            head = npf.header_data_from_array_1_0(a)
            buf = bytearray()
            buf += _NPY_TAG
            import io  # noqa: PLC0415

            b = io.BytesIO()
            npf.write_array_header_2_0(b, head) if len(repr(head)) > 65000 else npf.write_array_header_1_0(b, head)
            buf += b.getvalue()
            buf += memoryview(np.ascontiguousarray(a)).cast("B")
            return bytes(buf)
        return memoryview(a).cast("B")  # the U8 bytes, no further copy

    def get_batch(self, keys: Sequence[CairnKey]) -> List[Any]:
        return [self.get(k) for k in keys]

    def exists(self, key: CairnKey) -> bool:
        c = self._c()
        try:
            if key.kind == "model":
                self._live_model(c, key.name)
            else:
                c.tensor_info(key.name)
            return True
        except _errors.NotFound:
            return False

    def evict(self, key: CairnKey) -> None:
        c = self._c()
        try:
            if key.kind == "model":
                c.remove(key.name)
            else:
                c.tensor_delete(key.name)
        except _errors.NotFound:
            pass
        self._mine.discard(key)

    # -- storage --

    def _store(self, key: CairnKey, a: np.ndarray, dtype: Optional[str]) -> None:
        c = self._c()
        if key.kind == "model":
            c.save_model(key.name, {_DATA: a}, dtypes={_DATA: dtype} if dtype else None, durability=self.durability,
                         meta={"proxystore": key.form}, wait=True)
        else:
            c.put_tensor(key.name, a, dtype=dtype if dtype in ("BF16", "F8_E4M3", "F8_E5M2") else None)

    @staticmethod
    def _live_model(c: Any, name: str) -> Dict[str, Any]:
        """show(name); a model retired by evict (readable until `cairn gc`) counts as missing."""
        info = c.show(name)
        if info.get("retired_ns"):
            raise _errors.error("CAIRN_ERR_NOT_FOUND", f"not found: model {name!r} was evicted")
        return info

    def _load(self, key: CairnKey) -> Tuple[np.ndarray, Optional[str]]:
        """The stored array (one copy out of the daemon) and its cairn dtype."""
        c = self._c()
        if key.kind == "model":
            info = self._live_model(c, key.name)
            a = c.load_model(key.name, copy=True)[_DATA]
            return a, {t["name"]: t["dtype"] for t in info.get("tensors", [])}.get(_DATA)
        dt = c.tensor_info(key.name)[0]
        return c.get_tensor(key.name), dt
