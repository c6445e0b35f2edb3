"""PyTorch helpers: save and load state dicts, architecture graphs from modules, transfer learning.

``import cairn.torch`` (needs torch; the rest of ``cairn`` does not)::

    import cairn.torch as ct

    ct.save(model, "cand-9", meta={"score": 0.91})          # every tensor, plus the module's graph
    ct.save(model, "cand-17", parent="cand-9")              # only the tensors that changed; the rest inherited
    sd = ct.load("cand-17")                                 # CPU tensors: copy-on-write views, no copy
    ct.load("cand-17", module=fresh, device="cuda")         # strict load_state_dict, then on the GPU
    g = ct.architecture(model)                              # docs/graph-format.md, from torch.fx
    t = ct.transfer(new_model)                              # best stored ancestor -> matching layers

Every function takes ``client=`` (a :class:`cairn.Client`); without it a connection made with
:func:`cairn.connect` on first use is shared by the process. See docs/python.md ("cairn.torch").
"""
from __future__ import annotations

import ctypes
import math
import operator
import os
import threading
import time
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import nn

from . import _dtypes, _errors, _ffi
from . import client as _client_module
from .client import Client, Ticket, connect
from ._torch_module import assign_state as _assign_state, read_into_module as _read_into_module

__all__ = ["save", "load", "architecture", "transfer", "default_client", "save_sharded", "load_sharded",
           "Snapshot"]

StateDict = Mapping[str, torch.Tensor]
DeviceLike = Union[str, int, torch.device, None]

_MEM_CUDA = getattr(_ffi, "MEM_CUDA", 1)  # cairn_memkind CAIRN_MEM_CUDA (include/cairn/cairn.h)

# ---- the default client ----

_default: Optional[Client] = None
_default_lock = threading.Lock()


def default_client() -> Client:
    """The process-wide client used when no ``client=`` is given (``cairn.connect()`` on first use;
    connected again if it was closed)."""
    global _default
    with _default_lock:
        if _default is None or _default.closed:
            _default = connect()
        return _default


def _client(client: Optional[Client]) -> Client:
    return client if client is not None else default_client()


# ---- dtypes: torch <-> cairn ----

def _opt_dtype(name: str) -> Optional[torch.dtype]:
    return getattr(torch, name, None)


# cairn dtype -> (torch dtype, the torch dtype of the same size the raw numpy bits are read as, or None)
_TORCH_OF: Dict[str, Tuple[Optional[torch.dtype], Optional[torch.dtype]]] = {
    "F64": (torch.float64, None), "F32": (torch.float32, None), "F16": (torch.float16, None),
    "BF16": (torch.bfloat16, torch.int16),
    "F8_E4M3": (_opt_dtype("float8_e4m3fn"), torch.uint8), "F8_E5M2": (_opt_dtype("float8_e5m2"), torch.uint8),
    "I64": (torch.int64, None), "I32": (torch.int32, None), "I16": (torch.int16, None), "I8": (torch.int8, None),
    "U8": (torch.uint8, None), "BOOL": (torch.bool, None),
    "U16": (_opt_dtype("uint16"), None), "U32": (_opt_dtype("uint32"), None), "U64": (_opt_dtype("uint64"), None),
}
_CAIRN_OF: Dict[torch.dtype, str] = {t: name for name, (t, _) in _TORCH_OF.items() if t is not None}
# Raw-bit views for the types numpy lacks: torch dtype -> (same-size torch int type, numpy type, cairn name).
_RAW_VIEW: Dict[torch.dtype, Tuple[torch.dtype, np.dtype, str]] = {torch.bfloat16: (torch.int16, np.dtype("<u2"), "BF16")}
for _name, _cname in (("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2")):
    if _opt_dtype(_name) is not None:
        _RAW_VIEW[getattr(torch, _name)] = (torch.uint8, np.dtype("u1"), _cname)


def _torch_dtype(cairn_name: str, what: str) -> torch.dtype:
    t = _TORCH_OF.get(cairn_name, (None, None))[0]
    if t is None:
        raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                            f"invalid argument: {what} is stored as {cairn_name}, which this torch "
                            f"({torch.__version__}) has no dtype for; read it with Client.load_model instead")
    return t


def _to_numpy(name: str, value: Any) -> Tuple[np.ndarray, str]:
    """A state-dict entry as a CPU numpy array over the same bytes (no copy for CPU tensors) and
    the cairn dtype to store it as."""
    if not isinstance(value, torch.Tensor):
        raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                            f"invalid argument: state dict entry {name!r} is a {type(value).__name__}, not a tensor "
                            "(cairn.torch stores tensors only)")
    t = value.detach()
    if t.layout != torch.strided or t.is_quantized:
        raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                            f"invalid argument: tensor {name!r} is {'quantized' if t.is_quantized else t.layout}; "
                            "cairn.torch stores dense tensors (convert it first)")
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.resolve_conj().resolve_neg()
    if t.dtype in _RAW_VIEW:
        as_int, np_raw, cname = _RAW_VIEW[t.dtype]
        return t.view(as_int).numpy().view(np_raw), cname
    if t.dtype not in _CAIRN_OF:
        raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                            f"invalid argument: tensor {name!r} has dtype {t.dtype}, which cairn does not store")
    return t.numpy(), _CAIRN_OF[t.dtype]


def _from_numpy(name: str, arr: np.ndarray, cairn_name: str) -> torch.Tensor:
    """An owned (writable) numpy array as a torch tensor over the same memory, in its torch dtype."""
    want = _torch_dtype(cairn_name, f"tensor {name!r}")
    raw = _TORCH_OF[cairn_name][1]
    if raw is not None:
        signed = {torch.int16: np.int16, torch.uint8: np.uint8}[raw]
        return torch.from_numpy(arr.view(signed)).view(want)
    return torch.from_numpy(arr)


def _bits(a: np.ndarray) -> np.ndarray:
    """``a`` viewed as unsigned integers of its item size (bitwise comparison: NaNs, -0.0)."""
    return a.view(np.dtype(f"u{a.dtype.itemsize}")) if a.dtype.itemsize in (1, 2, 4, 8) else a


def _same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype.itemsize == b.dtype.itemsize and bool(np.array_equal(_bits(a), _bits(b)))


# ---- save and load ----

def save(
    module_or_state_dict: Union[nn.Module, StateDict],
    id: str,
    parent: Optional[str] = None,
    meta: Optional[Mapping[str, Any]] = None,
    *,
    client: Optional[Client] = None,
    arch: Optional[Mapping[str, Any]] = None,
    durability: str = "global",
    wait: bool = True,
    pipelined: bool = False,
    _before_commit: Optional[Any] = None,
    _copy_threads: int = 0,
) -> Ticket:
    """Stores a module's state dict (parameters and buffers) or a state dict as model ``id``.

    With ``parent``, every tensor equal to the parent's (same name, dtype, shape and bytes) is
    declared inherited: no bytes are sent or stored again; only the others are. With a module, its
    :func:`architecture` is stored too (``arch=`` overrides it); with a state dict and a parent of
    the same layout, the parent's stored architecture is reused.

    Returns the :class:`cairn.Ticket` of the commit; by default (``wait=True``) it has reached
    ``durability`` already. With ``wait=False, pipelined=True`` it returns as soon as the bytes are
    in the daemon's arena (see :meth:`cairn.Client.save_model`). bf16 (and, with a torch that has
    them, fp8) tensors are stored as BF16/FP8.
    """
    c = _client(client)
    module = module_or_state_dict if isinstance(module_or_state_dict, nn.Module) else None
    state = module.state_dict() if module is not None else module_or_state_dict
    if not isinstance(state, Mapping):
        raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                            "invalid argument: save() takes an nn.Module or a state dict (name -> tensor), "
                            f"not a {type(module_or_state_dict).__name__}")
    arrays: Dict[str, np.ndarray] = {}
    cdtypes: Dict[str, str] = {}
    for name, value in state.items():
        arrays[name], cdtypes[name] = _to_numpy(name, value)

    inherited: List[str] = []
    parent_info: Optional[Dict[str, Any]] = None
    if parent is not None:
        parent_info = c.show(parent)
        layout = {t["name"]: (t["dtype"], tuple(t["shape"])) for t in parent_info.get("tensors", [])}
        candidates = [n for n, a in arrays.items() if layout.get(n) == (cdtypes[n], a.shape)]
        if candidates:
            views = c.load_model(parent, names=candidates)  # zero-copy; the lease ends with `views`
            try:
                inherited = [n for n in candidates if _same_bytes(views[n], arrays[n])]
            finally:
                del views
        if arch is None and module is None and parent_info.get("architecture") and \
                list(layout) == list(arrays) and all(layout[n] == (cdtypes[n], arrays[n].shape) for n in arrays):
            arch = parent_info["architecture"]  # a state dict with the parent's layout: the parent's graph
    if arch is None and module is not None:
        arch = architecture(module)

    keep = set(inherited)
    changed = {n: a for n, a in arrays.items() if n not in keep}
    raw = {n: cdtypes[n] for n in changed if cdtypes[n] in ("BF16", "F8_E4M3", "F8_E5M2")}
    return c.save_model(id, changed, parent=parent, arch=arch, meta=meta, durability=durability,
                        inherit=inherited, dtypes=raw, wait=wait, order=list(arrays), pipelined=pipelined and not wait,
                        before_commit=_before_commit, copy_threads=_copy_threads)


def _cuda_state(c: Client, id: str, device: torch.device) -> Optional[Dict[str, torch.Tensor]]:
    """Reads model ``id`` straight into tensors on CUDA ``device`` (cairn_model_read_tensor with
    CAIRN_MEM_CUDA: one copy from the daemon's arena to the GPU). None when this libcairn was built
    without CUDA (the caller then goes through host memory)."""
    conn, lib = c._conn, c._lib  # the reader API has no public Python wrapper for device memory
    mid = id.encode("utf-8")
    torch.cuda.current_stream(device).synchronize()  # cudaMemcpy below runs outside torch's streams
    out: Dict[str, torch.Tensor] = {}
    with conn.op() as h:
        r = ctypes.c_void_p()
        st = lib.cairn_model_open(h, mid, ctypes.byref(r))
        if st != 0:
            raise _errors.last_error(st)
        try:
            for name, dt, shape, nbytes in c._reader_infos(r):
                t = torch.empty(shape, dtype=_torch_dtype(dt, f"tensor {name!r}"), device=device)
                if t.numel() * t.element_size() != nbytes:
                    raise _errors.error("CAIRN_ERR_PROTOCOL", f"protocol error: tensor {name!r} has {nbytes} bytes")
                if nbytes:
                    st = lib.cairn_model_read_tensor(r, name.encode("utf-8"), t.data_ptr(), nbytes, _MEM_CUDA)
                    if st != 0:
                        err = _errors.last_error(st)
                        if isinstance(err, _errors.Unavailable) and "without CUDA" in err.message:
                            return None
                        raise err
                out[name] = t
        finally:
            lib.cairn_model_close(r)
    return out


class _DeviceView:
    """``nbytes`` of device memory at ``ptr`` as a CUDA array (``__cuda_array_interface__``, read-only),
    holding the reader's device leases (client._Lease: the reader is closed, and the leases released,
    when the last tensor is gone); torch.as_tensor keeps it alive as long as the tensor."""

    def __init__(self, ptr: int, nbytes: int, leases: Any):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, True),
                                         "strides": None, "version": 3, "stream": None}
        self._leases = leases


def _hbm_backend(c: Client) -> Optional[str]:
    """The daemon's HBM tier backend ("cuda", "emulated"), or None when it has none."""
    tier = c.stats().get("tiers", {}).get("hbm", {})
    return tier.get("backend") if tier.get("enabled") else None


def _hbm_state(c: Client, id: str, device: torch.device) -> Dict[str, torch.Tensor]:
    """Model ``id`` as tensors that alias the daemon's copies in its HBM tier on ``device``
    (cairn_model_map_tensor_device: zero-copy through CUDA IPC), read-only; the device leases last
    as long as the tensors (docs/gpu.md)."""
    conn, lib = c._conn, c._lib
    out: Dict[str, torch.Tensor] = {}
    with conn.op() as h:
        r = ctypes.c_void_p()
        st = lib.cairn_model_open(h, id.encode("utf-8"), ctypes.byref(r))
        if st != 0:
            raise _errors.last_error(st)
        conn.open_readers.add(r.value)  # type: ignore[arg-type]
        leases = _client_module._Lease(conn, r.value)  # type: ignore[arg-type]
        infos = list(c._reader_infos(r))
        for name, dt, shape, nbytes in infos:
            tdtype = _torch_dtype(dt, f"tensor {name!r}")
            if not nbytes:
                out[name] = torch.empty(shape, dtype=tdtype, device=device)
                continue
            ptr, n = ctypes.c_void_p(), ctypes.c_size_t()
            st = lib.cairn_model_map_tensor_device(r, name.encode("utf-8"), device.index, ctypes.byref(ptr),
                                                   ctypes.byref(n))
            if st != 0:
                raise _errors.last_error(st)
            raw = torch.as_tensor(_DeviceView(ptr.value, n.value, leases), device=device)
            out[name] = raw.view(tdtype).reshape(shape)
    return out


_cuda_in_library: Optional[bool] = None  # learnt on the first CUDA load


def _state(c: Client, id: str, device: Optional[torch.device], copy: bool = True) -> Dict[str, torch.Tensor]:
    global _cuda_in_library
    if device is not None and device.type == "cuda" and torch.cuda.is_available() and _cuda_in_library is not False:
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if _hbm_backend(c) == "cuda":
            return _hbm_state(c, id, device)
        got = _cuda_state(c, id, device)
        _cuda_in_library = got is not None
        if got is not None:
            return got
    dtypes = {t["name"]: t["dtype"] for t in c.show(id).get("tensors", [])}
    on_host = device is None or device.type == "cpu"
    if copy or not on_host:
        arrays = c.load_model(id, copy=True)  # owned arrays: the tensors share their memory, nothing stays leased
    else:
        arrays = c.load_model(id, writable=True)  # copy-on-write views of the arena: no copy
    out = {name: _from_numpy(name, a, dtypes[name]) for name, a in arrays.items()}
    if not on_host:
        out = {name: t.to(device) for name, t in out.items()}
    return out


def load(
    id: str,
    module: Optional[nn.Module] = None,
    device: DeviceLike = None,
    *,
    client: Optional[Client] = None,
    strict: bool = True,
    copy: bool = False,
) -> Union[Dict[str, torch.Tensor], nn.Module]:
    """Model ``id`` as a state dict of writable CPU tensors (the model's tensor order), or, with
    ``module``, loaded into it (strict by default, with load_state_dict's checks) and the module
    returned.

    On the host the tensors are copy-on-write views of the daemon's shared arena: loading copies
    nothing, reading the weights costs no copy, and a write (an optimizer step) copies only the
    pages it touches into this process; the stored model never changes. The model stays pinned in
    the daemon's memory while any of the tensors lives (a module keeps it as long as it keeps those
    weights). ``copy=True``: tensors that own their memory (one copy; nothing stays pinned), and a
    module on the host is filled with one copy straight into its parameters' memory.

    ``device``: where the tensors (and the module, moved first) go. When the daemon has a CUDA HBM
    tier (docs/gpu.md), a state dict loaded onto a CUDA device aliases the daemon's copies in GPU
    memory (no copy at all; read-only; the device leases last as long as the tensors; a module
    copies from them). Otherwise a CUDA device is filled straight from the daemon's shared memory
    through the C API's CUDA memkind when libcairn has CUDA, else through host memory. bf16 tensors
    come back as torch.bfloat16.
    """
    c = _client(client)
    dev = torch.device(device) if device is not None else None
    if module is None:
        return _state(c, id, dev, copy)
    if dev is not None:
        module.to(dev)
    on_host = dev is None or dev.type == "cpu"
    if copy and on_host:
        _read_into_module(c, id, module, strict)
        return module
    state = _state(c, id, dev, copy)
    if copy or not on_host:
        module.load_state_dict(state, strict=strict)
    else:
        _assign_state(module, state, strict)
    return module


# ---- sharded over MPI ranks (docs/mpi.md) ----

def _assign(sizes: Sequence[int], nranks: int) -> List[int]:
    """Which rank owns each tensor: largest first, each to the rank with the fewest bytes so far
    (ties: the lower rank) -- the same rule as the C helper cairn_mpi_assign."""
    load = [0] * nranks
    owner = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda k: (-sizes[k], k)):
        best = min(range(nranks), key=lambda r: (load[r], r))
        owner[i] = best
        load[best] += sizes[i]
    return owner


class Snapshot:
    """A checkpoint whose bytes are copied into the daemon's arena by a background thread
    (``save_sharded(..., background=True)``), while the caller goes on with work that only reads
    the weights (the next forward and backward pass): DeepFreeze's way of taking the copy off the
    training's critical path. The weights must not change until :meth:`wait_copied` returned
    (``optimizer=`` makes the optimizer's next ``step()`` wait for it). A tensor that changed anyway
    is caught before the commit (its version counter moved) and the checkpoint fails rather than
    store a mixture; that check is a safety net, not the contract (a change made through
    ``tensor.data`` does not move the counter).

    ``wait()`` and ``reached``/``done`` behave as :class:`cairn.Ticket`'s, for the whole model."""

    def __init__(self, model_id: str, durability: str) -> None:
        #: The model the checkpoint is for.
        self.model_id = model_id
        #: The durability asked for.
        self.durability = durability
        self._copied = threading.Event()
        self._ticket: Optional[Ticket] = None
        self._error: Optional[BaseException] = None
        self._thread: Optional[threading.Thread] = None
        #: Seconds the background thread took to put this rank's bytes in the arena.
        self.copy_seconds: Optional[float] = None

    @property
    def copied(self) -> bool:
        """True once this rank's bytes are in the arena (or the copy failed): the weights may change."""
        return self._copied.is_set()

    def wait_copied(self, timeout: Optional[float] = None) -> None:
        """Blocks until this rank's bytes are in the daemon's arena, after which the weights may
        change. Raises the copy's error (the checkpoint then failed), or Timeout."""
        if not self._copied.wait(timeout):
            raise _errors.error("CAIRN_ERR_TIMEOUT",
                                f"timeout: checkpoint {self.model_id!r} is still being copied after {timeout} s")
        if self._error is not None:
            raise self._error

    def wait(self, timeout: Optional[float] = None) -> str:
        """Waits for the copy, then for the model's durability (as :meth:`cairn.Ticket.wait`)."""
        start = time.monotonic()
        self.wait_copied(timeout)
        assert self._ticket is not None
        left = None if timeout is None else max(0.0, timeout - (time.monotonic() - start))
        return self._ticket.wait(left)

    @property
    def reached(self) -> str:
        """``"copying"`` until the bytes are in the arena, then the commit's :attr:`cairn.Ticket.reached`
        (``"failed"`` when the copy or the commit failed before it was sent)."""
        if not self.copied:
            return "copying"
        if self._ticket is None:
            return "failed"
        return self._ticket.reached

    @property
    def done(self) -> bool:
        """True once the durability is reached or the checkpoint failed."""
        return self.copied and (self._ticket is None or self._ticket.done)

    def _start(self, save_call: Any, check: Any) -> None:
        def run() -> None:
            t0 = time.perf_counter()
            try:
                self._ticket = save_call(check)
            except BaseException as e:  # raised to whoever waits
                self._error = e
            finally:
                self.copy_seconds = time.perf_counter() - t0
                self._copied.set()

        # Not a daemon thread: an interpreter that exits meanwhile finishes the copy first.
        self._thread = threading.Thread(target=run, name=f"cairn-checkpoint-{self.model_id}")
        self._thread.start()

    def _hold(self, optimizer: Any) -> None:
        """The optimizer's next step() waits for the copy first (then the hook removes itself)."""
        own = "step" in vars(optimizer)
        original = optimizer.step

        def step(*args: Any, **kwargs: Any) -> Any:
            try:
                self.wait_copied()
            except Exception as e:  # the checkpoint failed; training goes on, wait() raises it
                warnings.warn(f"cairn: background checkpoint {self.model_id!r} failed: {e}", RuntimeWarning,
                              stacklevel=2)
            finally:
                if own:
                    optimizer.step = original
                else:
                    vars(optimizer).pop("step", None)
            return original(*args, **kwargs)

        optimizer.step = step


def _unchanged_check(state: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> Any:
    """A before_commit hook that fails the commit when a tensor whose memory the copy read (a CPU
    tensor, no conversion) changed in place since the call (its version counter moved)."""
    watched = []
    for name, value in state.items():
        if isinstance(value, torch.Tensor) and value.device.type == "cpu" and \
                arrays[name].__array_interface__["data"][0] == value.data_ptr():
            watched.append((name, value, value._version))

    def check() -> None:
        for name, t, version in watched:
            if t._version != version:
                raise _errors.error(
                    "CAIRN_ERR_INVALID_ARGUMENT",
                    f"invalid argument: tensor {name!r} changed while the background checkpoint copied it, so "
                    "nothing was stored; call wait_copied() on the snapshot (or pass optimizer=) before changing "
                    "the weights")
    return check


def save_sharded(
    module_or_state_dict: Union[nn.Module, StateDict],
    id: str,
    comm: Any,
    parent: Optional[str] = None,
    meta: Optional[Mapping[str, Any]] = None,
    *,
    client: Optional[Client] = None,
    durability: str = "local",
    timeout: float = 60.0,
    background: bool = False,
    optimizer: Any = None,
) -> Union[Ticket, Snapshot]:
    """Collective over the mpi4py communicator ``comm``: every rank passes the same state (as the
    replicas of data-parallel training hold), and each rank commits only its share of the tensors
    (dealt out by size) as one part of model ``id``. Returns as soon as this rank's share is in the
    daemon's arena (the commit is pipelined: hashing and registering happen behind the caller) with a
    ticket that resolves when the whole model reaches ``durability`` -- or raises, on every rank, when
    some rank's part did not arrive within ``timeout`` seconds or the commit failed (e.g. the id
    exists). With one rank it is :func:`save` without waiting, pipelined.

    ``background=True``: returns at once with a :class:`Snapshot`; a thread copies the share into the
    arena while the caller goes on (the next forward and backward pass only read the weights). The
    weights must not change before ``snapshot.wait_copied()`` returned; ``optimizer=`` (a
    torch.optim optimizer) makes its next ``step()`` wait for that by itself. The client's other
    calls wait for the copy meanwhile (use another client for other work)."""
    c = _client(client)
    state = module_or_state_dict.state_dict() if isinstance(module_or_state_dict, nn.Module) else module_or_state_dict
    names = list(state)
    arrays: Dict[str, np.ndarray] = {}
    cdtypes: Dict[str, str] = {}
    for name in names:
        arrays[name], cdtypes[name] = _to_numpy(name, state[name])
    rank, size = comm.Get_rank(), comm.Get_size()
    # Behind a training step the copy takes one core and leaves the others to the training.
    threads = 1 if background else 0
    if size == 1:
        def save_call(check: Any = None) -> Ticket:
            return save(state, id, parent, meta, client=c, durability=durability, wait=False, pipelined=True,
                        _before_commit=check, _copy_threads=threads)
    else:
        owner = _assign([arrays[n].nbytes for n in names], size)
        mine = {n: arrays[n] for i, n in enumerate(names) if owner[i] == rank}
        raw = {n: cdtypes[n] for n in mine if cdtypes[n] in ("BF16", "F8_E4M3", "F8_E5M2")}

        def save_call(check: Any = None) -> Ticket:
            return c.save_model(id, mine, parent=parent, meta=meta if rank == 0 else None, durability=durability,
                                dtypes=raw, part=(rank, size), part_timeout=timeout, pipelined=True,
                                before_commit=check, copy_threads=threads)
    if not background:
        return save_call()
    snap = Snapshot(id, durability)
    if optimizer is not None:
        snap._hold(optimizer)
    snap._start(save_call, _unchanged_check(state, arrays))
    return snap


def _daemon_groups(comm: Any) -> Tuple[Any, Any, int, int]:
    """(local, cross, node, nodes): the ranks sharing a daemon (one node, MPI_COMM_TYPE_SHARED, or
    equal $CAIRN_MPI_NODE values) and the ranks with the same node-local rank on every node; cross is
    None when the nodes hold different numbers of ranks."""
    from mpi4py import MPI
    rank = comm.Get_rank()
    env = os.environ.get("CAIRN_MPI_NODE", "")
    local = comm.Split(int(env), rank) if env.isdigit() else comm.Split_type(MPI.COMM_TYPE_SHARED, rank)
    sizes = comm.allgather(local.Get_size())
    if min(sizes) != max(sizes):
        return local, None, 0, 0
    cross = comm.Split(local.Get_rank(), rank)
    return local, cross, cross.Get_rank(), cross.Get_size()


def load_sharded(id: str, comm: Any, *, client: Optional[Client] = None) -> Dict[str, torch.Tensor]:
    """Collective over ``comm``: model ``id`` as a state dict on every rank. Node-aware, as
    ``cairn_mpi_restore``: the tensors are dealt out over the nodes; every rank of a node reads its
    node's share straight from the node's daemon (one copy from the shared arena) and the other
    nodes' shares arrive by broadcast, so the model is read once in all from below the nodes' memory.
    On one node nothing goes through MPI. (Nodes with different rank counts: each rank reads its own
    share and broadcasts it.)"""
    c = _client(client)
    rank, size = comm.Get_rank(), comm.Get_size()
    infos = c.show(id).get("tensors", [])
    names = [t["name"] for t in infos]
    local, cross, node, nodes = _daemon_groups(comm)
    try:
        group, me, over = (cross, node, nodes) if cross is not None else (comm, rank, size)
        owner = _assign([int(t["nbytes"]) for t in infos], over)
        mine = [n for i, n in enumerate(names) if owner[i] == me]
        got = c.load_model(id, names=mine, copy=True) if mine else {}
        out: Dict[str, torch.Tensor] = {}
        for i, t in enumerate(infos):
            name = t["name"]
            if owner[i] == me:
                buf = np.ascontiguousarray(got.pop(name))
            else:
                buf = np.empty(tuple(t["shape"]), dtype=_dtypes.numpy_dtype(t["dtype"]))
            if over > 1:
                group.Bcast(buf.reshape(-1).view(np.uint8), root=owner[i])
            out[name] = _from_numpy(name, buf, t["dtype"])
        return out
    finally:
        if cross is not None:
            cross.Free()
        local.Free()


# ---- architecture graphs ----

# Attributes that say how a module runs, not what it is.
_IGNORED_ATTRS = {"training", "inplace"}
# Modules whose public attributes fix the shapes of their tensors (others get their shapes in the config).
_SHAPED_BY_CONFIG = {
    "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
    "Linear", "Bilinear", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm",
    "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "LayerNorm", "GroupNorm", "Embedding",
}


def _jsonable(v: Any) -> Any:
    """A stable JSON value for a config entry (never an address or an id)."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else repr(v)
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(v)
    if isinstance(v, slice):
        return {"slice": [_jsonable(v.start), _jsonable(v.stop), _jsonable(v.step)]}
    if v is Ellipsis:
        return "..."
    if isinstance(v, torch.Tensor):
        return {"tensor": list(v.shape), "dtype": str(v.dtype)}
    if callable(v):
        return f"{getattr(v, '__module__', '') or ''}.{getattr(v, '__qualname__', type(v).__name__)}"
    return type(v).__name__


def _is_simple(v: Any) -> bool:
    if v is None or isinstance(v, (bool, int, float, str)):
        return True
    return isinstance(v, (list, tuple)) and all(_is_simple(x) for x in v)


def _module_config(m: nn.Module) -> Dict[str, Any]:
    """The constructor-relevant configuration of a module: its public scalar attributes (for
    torch.nn's modules exactly their constructor arguments, e.g. Conv2d's channels, kernel_size,
    stride, padding, dilation, groups), whether it has a bias, and, for modules whose config does
    not fix their tensors' shapes, those shapes (and its extra_repr when nothing else describes it)."""
    cfg: Dict[str, Any] = {}
    for k, v in vars(m).items():
        if k.startswith("_") or k in _IGNORED_ATTRS or not _is_simple(v):
            continue
        cfg[k] = _jsonable(v)
    for k in getattr(type(m), "__constants__", ()) or ():
        if k not in cfg and k not in _IGNORED_ATTRS and _is_simple(getattr(m, k, None)):
            cfg[k] = _jsonable(getattr(m, k, None))
    described = bool(cfg) or bool(getattr(type(m), "__constants__", None))
    if "bias" in m._parameters and "bias" not in cfg and "affine" not in cfg and "elementwise_affine" not in cfg:
        cfg["bias"] = m._parameters["bias"] is not None
    if type(m).__name__ not in _SHAPED_BY_CONFIG:
        shapes = {n: list(t.shape) for n, t in m.state_dict().items() if isinstance(t, torch.Tensor)}
        if shapes:
            cfg["tensors"] = shapes
    if not described:  # e.g. a module of another library that keeps its settings elsewhere
        rep = m.extra_repr()
        if rep:
            cfg["repr"] = rep
    return cfg


def _fn_name(target: Any) -> str:
    if isinstance(target, str):
        return target
    return getattr(target, "__name__", None) or type(target).__name__


class _Builder:
    """Accumulates layers; names are unique, and names of modules are their qualified names."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.layers: List[Dict[str, Any]] = []
        self.used: set = set()
        self.module_layer: Dict[str, str] = {}  # qualified module name -> its (first) layer
        self.attr_layer: Dict[str, str] = {}    # get_attr target -> its layer
        self.reserved = {n for n, _ in module.named_modules() if n}

    def unique(self, base: str, reserved_ok: bool = False) -> str:
        name = base or "module"
        k = 0
        while name in self.used or (not reserved_ok and name in self.reserved):
            k += 1
            name = f"{base}#{k}"
        self.used.add(name)
        return name

    def add(self, name: str, type_: str, config: Dict[str, Any], inputs: List[str]) -> None:
        layer: Dict[str, Any] = {"name": name, "type": type_}
        if config:
            layer["config"] = config
        layer["inputs"] = inputs
        self.layers.append(layer)

    def graph(self) -> Tuple[Dict[str, Any], Dict[str, Dict[str, str]]]:
        """The graph (with explicit tensor entries only where the name-prefix rule would not find the
        layer) and, per layer, suffix -> state-dict key of the tensors it owns."""
        owned: Dict[str, Dict[str, str]] = {}
        explicit: Dict[str, str] = {}
        for key in self.module.state_dict().keys():
            layer, suffix = None, None
            parts = key.split(".")
            for i in range(len(parts) - 1, 0, -1):
                prefix = ".".join(parts[:i])
                if prefix in self.module_layer:
                    layer, suffix = self.module_layer[prefix], ".".join(parts[i:])
                    break
            if layer is None and key in self.attr_layer:
                layer, suffix = self.attr_layer[key], ""
            if layer is None:
                continue  # a tensor no layer uses (e.g. of a module the forward pass skips)
            owned.setdefault(layer, {})[suffix] = key
            by_rule = key.rsplit(".", 1)[0] if "." in key else key
            if by_rule != layer:
                explicit[key] = layer
        g: Dict[str, Any] = {"layers": self.layers}
        if explicit:
            g["tensors"] = explicit
        return g, owned


def _traced(module: nn.Module) -> Tuple[Dict[str, Any], Dict[str, Dict[str, str]]]:
    import torch.fx

    gm = torch.fx.symbolic_trace(module)
    b = _Builder(module)
    node_layer: Dict[Any, str] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]

    def config_args(node: Any, inputs: List[Any]) -> Dict[str, Any]:
        index = {n: i for i, n in enumerate(inputs)}

        def enc(v: Any) -> Any:
            if isinstance(v, torch.fx.Node):
                return f"${index[v]}"
            if isinstance(v, (list, tuple)):
                return [enc(x) for x in v]
            if isinstance(v, dict):
                return {str(k): enc(x) for k, x in v.items()}
            return _jsonable(v)

        cfg: Dict[str, Any] = {"args": enc(list(node.args))}
        if node.kwargs:
            cfg["kwargs"] = enc(dict(node.kwargs))
        return cfg

    for node in gm.graph.nodes:
        inputs = list(node.all_input_nodes)
        in_names = [node_layer[n] for n in inputs if n in node_layer]
        if node.op == "placeholder":
            i = placeholders.index(node)
            name = b.unique("input" if len(placeholders) == 1 else f"input:{node.target}")
            b.add(name, "Input", {"index": i}, [])
        elif node.op == "call_module":
            sub = gm.get_submodule(node.target) if hasattr(gm, "get_submodule") else dict(gm.named_modules())[node.target]
            first = node.target not in b.module_layer and node.target not in b.used
            name = b.unique(node.target, reserved_ok=first)
            if first:
                b.module_layer[node.target] = name
            b.add(name, type(sub).__name__, _module_config(sub), in_names)
        elif node.op in ("call_function", "call_method"):
            kind = "fn" if node.op == "call_function" else "method"
            name = b.unique(node.name)
            b.add(name, f"{kind}:{_fn_name(node.target)}", config_args(node, inputs), in_names)
        elif node.op == "get_attr":
            name = b.unique(node.target)
            b.attr_layer.setdefault(node.target, name)
            try:
                value = operator.attrgetter(node.target)(gm)
            except AttributeError:
                value = None
            cfg = {"shape": list(value.shape)} if isinstance(value, torch.Tensor) else {"value": _jsonable(value)}
            b.add(name, "Attr", cfg, [])
        else:
            continue  # output: not a layer
        node_layer[node] = name
    return b.graph()


def _module_order(module: nn.Module) -> Tuple[Dict[str, Any], Dict[str, Dict[str, str]]]:
    """The fallback graph: an input, then each leaf module (and each module holding tensors of its
    own) in registration order, each fed by the previous one."""
    b = _Builder(module)
    prev = b.unique("input")
    b.add(prev, "Input", {"index": 0}, [])
    for qual, m in module.named_modules():
        own = list(m._parameters) + list(m._buffers)
        if any(True for _ in m.children()) and not own:
            continue
        if qual == "" and not own:
            continue
        name = b.unique(qual or type(m).__name__, reserved_ok=True)
        b.module_layer[qual] = name
        if any(True for _ in m.children()):  # a container with tensors of its own: describe only those
            cfg = {"tensors": {n: list(t.shape) for n, t in list(m._parameters.items()) + list(m._buffers.items())
                               if t is not None}}
        else:
            cfg = _module_config(m)
        b.add(name, type(m).__name__, cfg, [prev])
        prev = name
    g, owned = b.graph()
    if "" in b.module_layer:  # the root's own tensors have no prefix: map them explicitly
        root = b.module_layer[""]
        for n in list(module._parameters) + list(module._buffers):
            if n in module.state_dict():
                g.setdefault("tensors", {})[n] = root
                owned.setdefault(root, {})[n] = n
    return g, owned


def _architecture(module: nn.Module) -> Tuple[Dict[str, Any], Dict[str, Dict[str, str]], bool]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            g, owned = _traced(module)
        return g, owned, True
    except Exception:  # torch.fx cannot trace data-dependent control flow, some builtins, ...
        g, owned = _module_order(module)
        return g, owned, False


def architecture(module: nn.Module) -> Dict[str, Any]:
    """The architecture graph of ``module`` (docs/graph-format.md), from torch.fx tracing where it
    works, else the chain of its leaf modules in registration order.

    One layer per call of a leaf module (named by its qualified name, so ``layer1.0.conv1.weight``
    belongs to layer ``layer1.0.conv1``; a module called again gets ``name#1``, ...), with its class
    name as ``type`` and its constructor configuration as ``config``; one per function or method
    call (``fn:add``, ``method:flatten``, config: the arguments, ``$i`` for the i-th input); one
    ``Input`` layer per forward argument; one ``Attr`` layer per tensor attribute read directly.
    Two modules built independently in the same way get the same graph, hence the same layer
    signatures.
    """
    return _architecture(module)[0]


# ---- transfer learning ----

def transfer(
    module: nn.Module,
    *,
    client: Optional[Client] = None,
    where: Optional[Mapping[str, Any]] = None,
) -> Dict[str, Any]:
    """Loads into ``module`` the tensors of every layer whose signature (the layer and everything
    upstream of it) matches the best stored ancestor (``Client.best_ancestor``, optionally only
    among models whose metadata match ``where``). Tensors whose shape differs are skipped.

    Returns ``{"model", "matched", "score", "layers" (the module's matched layers),
    "tensors" (the module's state-dict key -> the stored tensor it got), "skipped"
    (stored tensors not loaded, with why)}``; ``model`` is None and nothing is loaded when no stored
    model shares a layer.
    """
    c = _client(client)
    graph, owned, _ = _architecture(module)
    ans = c.best_ancestor(graph, where)
    result: Dict[str, Any] = {"model": ans.get("model"), "matched": ans.get("matched", 0),
                              "score": ans.get("score"), "layers": list(ans.get("layers") or []),
                              "tensors": {}, "skipped": []}
    if not ans.get("model"):
        return result
    plan: Dict[str, str] = {}  # module key -> stored tensor
    for entry in ans.get("tensors") or []:
        layer, src = entry["layer"], entry["from"]
        mine = owned.get(layer, {})
        for s in entry.get("tensors") or []:
            # Relative to its layer: "<from>.<suffix>"; an Attr layer's own tensor; else (a tensor
            # mapped explicitly, e.g. a root module's own parameter) its whole name.
            suffix = s[len(src) + 1:] if s.startswith(src + ".") else ("" if s == src else s)
            key = mine.get(suffix)
            if key is None:
                result["skipped"].append({"tensor": s, "why": f"layer {layer!r} has no tensor for it"})
            else:
                plan[key] = s
    if not plan:
        return result
    dtypes = {t["name"]: t["dtype"] for t in c.show(ans["model"]).get("tensors", [])}
    targets = module.state_dict(keep_vars=True)
    views = c.load_model(ans["model"], names=list(dict.fromkeys(plan.values())))  # zero-copy
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.from_numpy on the read-only views: only read here
            for key, s in plan.items():
                dst = targets[key]
                src = _from_numpy(s, views[s], dtypes[s])
                if tuple(src.shape) != tuple(dst.shape):
                    result["skipped"].append({"tensor": s, "why": f"shape {tuple(src.shape)} does not fit "
                                                                  f"{key!r} {tuple(dst.shape)}"})
                    continue
                dst.copy_(src)
                result["tensors"][key] = s
    finally:
        del views
    return result
