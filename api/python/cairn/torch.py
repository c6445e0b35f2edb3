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

import os
import threading
import time
import warnings
import weakref
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import nn

from . import _dtypes, _errors, _progress
from . import _torch_dtypes as _td
from .client import Client, DeviceArray, Ticket, connect, library_has_cuda
from ._torch_graph import _architecture, architecture
from ._torch_module import assign_state as _assign_state, read_into_module as _read_into_module

__all__ = ["save", "load", "architecture", "transfer", "default_client", "save_sharded", "load_sharded",
           "Snapshot"]

StateDict = Mapping[str, torch.Tensor]
DeviceLike = Union[str, int, torch.device, None]

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

_torch_dtype = _td.torch_dtype
_to_numpy = _td.to_numpy
_from_numpy = _td.from_numpy


def _device_dtype(t: torch.Tensor) -> Optional[str]:
    """The cairn dtype of a CUDA tensor stored from device memory, None for a dtype cairn lacks."""
    return _td.cairn_dtype(t.dtype)


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
    progress: bool = False,
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

    ``progress=True`` shows a progress bar on stderr (tqdm's when installed) over the bytes copied
    into the daemon; off by default.
    """
    c = _client(client)
    module = module_or_state_dict if isinstance(module_or_state_dict, nn.Module) else None
    state = module.state_dict() if module is not None else module_or_state_dict
    if not isinstance(state, Mapping):
        raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                            "invalid argument: save() takes an nn.Module or a state dict (name -> tensor), "
                            f"not a {type(module_or_state_dict).__name__}")
    arrays: Dict[str, Any] = {}
    cdtypes: Dict[str, str] = {}
    on_device: Dict[str, torch.Tensor] = {}  # CUDA tensors: copied device-to-host straight into the arena
    for name, value in state.items():
        if isinstance(value, torch.Tensor) and value.is_cuda and _device_dtype(value) is not None:
            t = value.detach().resolve_conj().resolve_neg().contiguous()
            on_device[name] = t
            cdtypes[name] = _device_dtype(t)
            arrays[name] = DeviceArray(t.data_ptr(), t.shape, cdtypes[name], owner=t)
            continue
        arrays[name], cdtypes[name] = _to_numpy(name, value)
    for dev in {t.device for t in on_device.values()}:
        torch.cuda.current_stream(dev).synchronize()  # the library's copies run outside torch's streams

    inherited: List[str] = []
    parent_info: Optional[Dict[str, Any]] = None
    if parent is not None:
        parent_info = c.show(parent)
        layout = {t["name"]: (t["dtype"], tuple(t["shape"])) for t in parent_info.get("tensors", [])}
        candidates = [n for n, a in arrays.items() if layout.get(n) == (cdtypes[n], a.shape)]
        if candidates:
            views = c.load_model(parent, names=candidates)  # zero-copy; the lease ends with `views`
            try:
                inherited = [n for n in candidates
                             if _same_bytes(views[n], _to_numpy(n, on_device[n])[0] if n in on_device else arrays[n])]
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
    def commit(tensors: Mapping[str, Any]) -> Ticket:
        bar = _progress.bar(_progress.bytes_of(tensors.values()), f"save {id}", progress)
        try:
            return c.save_model(id, tensors, parent=parent, arch=arch, meta=meta, durability=durability,
                                inherit=inherited, dtypes=raw, wait=wait, order=list(arrays),
                                pipelined=pipelined and not wait, before_commit=_before_commit,
                                copy_threads=_copy_threads, on_bytes=bar.update if progress else None)
        finally:
            bar.close()

    if on_device and not library_has_cuda():
        # This libcairn cannot copy from CUDA memory (built without CUDA): through host memory.
        changed = {n: _to_numpy(n, on_device[n])[0] if n in on_device else a for n, a in changed.items()}
    return commit(changed)


def _cuda_state(c: Client, id: str, device: torch.device) -> Dict[str, torch.Tensor]:
    """Reads model ``id`` straight into new tensors on CUDA ``device`` with one request
    (cairn_model_read with CAIRN_MEM_CUDA: one copy from the daemon's arena, or HBM tier, to the GPU)."""
    torch.cuda.current_stream(device).synchronize()  # the library's copies run outside torch's streams
    with c.model_open(id) as r:
        out: Dict[str, torch.Tensor] = {}
        targets = []
        for name, dt, shape, nbytes in r.tensors:
            t = torch.empty(shape, dtype=_torch_dtype(dt, f"tensor {name!r}"), device=device)
            if t.numel() * t.element_size() != nbytes:
                raise _errors.error("CAIRN_ERR_PROTOCOL", f"protocol error: tensor {name!r} has {nbytes} bytes")
            if nbytes:
                targets.append((name, t.data_ptr(), nbytes))
            out[name] = t
        r.read_device(targets)
    return out


class _DeviceView:
    """``nbytes`` of device memory at ``ptr`` as a CUDA array (``__cuda_array_interface__``), holding
    the reader's device leases (the ``keeper`` of ModelReader.map_device: the leases end when the
    last tensor is gone); torch.as_tensor keeps it alive as long as the tensor. Declared writable:
    PyTorch refuses read-only CUDA arrays ("the read only flag is not supported"), so the contract
    that nobody writes the shared copy is load()'s documented one, not enforced."""

    def __init__(self, ptr: int, nbytes: int, leases: Any):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "strides": None, "version": 3, "stream": None}
        self._leases = leases


_hbm_backends: "weakref.WeakKeyDictionary[Client, Optional[str]]" = weakref.WeakKeyDictionary()


def _hbm_backend(c: Client) -> Optional[str]:
    """The daemon's HBM tier backend ("cuda", "emulated"), or None when it has none (asked once per
    client: a daemon's tiers do not change while it runs)."""
    if c not in _hbm_backends:
        tier = c.stats().get("tiers", {}).get("hbm", {})
        _hbm_backends[c] = tier.get("backend") if tier.get("enabled") else None
    return _hbm_backends[c]


def _hbm_state(c: Client, id: str, device: torch.device) -> Dict[str, torch.Tensor]:
    """Model ``id`` as tensors that alias the daemon's copies in its HBM tier on ``device``
    (cairn_model_map with CAIRN_MEM_CUDA: every tensor leased with one request, zero-copy through CUDA
    IPC); the device leases last as long as the tensors (docs/gpu.md)."""
    out: Dict[str, torch.Tensor] = {}
    with c.model_open(id) as r:
        mapped = r.map_device(device=device.index)
        for name, dt, shape, nbytes in r.tensors:
            tdtype = _torch_dtype(dt, f"tensor {name!r}")
            if not nbytes:
                out[name] = torch.empty(shape, dtype=tdtype, device=device)
                continue
            ptr, size, keeper = mapped[name]
            raw = torch.as_tensor(_DeviceView(ptr, size, keeper), device=device)
            out[name] = raw.view(tdtype).reshape(shape)
    return out


def _read_into_cuda_module(c: Client, id: str, module: nn.Module, device: torch.device) -> bool:
    """Fills ``module``'s parameters and buffers on ``device`` straight from the daemon's HBM copies
    (cairn_model_read with CAIRN_MEM_CUDA: one request, device-to-device copies back to back). False,
    having changed nothing, when the module's tensors do not match the model's one for one (names,
    dtypes, shapes, contiguous on ``device``): the caller then loads through load_state_dict, which
    says what differs."""
    targets = module.state_dict(keep_vars=True)
    with c.model_open(id) as r:
        infos = r.tensors
        if len(infos) != len(targets):
            return False
        copies = []
        for name, dt, shape, nbytes in infos:
            t = targets.get(name)
            if t is None or t.device != device or t.dtype != _torch_dtype(dt, f"tensor {name!r}") or \
                    tuple(t.shape) != tuple(shape) or not t.is_contiguous():
                return False
            if nbytes:
                copies.append((name, t.data_ptr(), nbytes))
        torch.cuda.current_stream(device).synchronize()  # the copies run on the library's stream
        r.read_device(copies)
        return True


def _state(c: Client, id: str, device: Optional[torch.device], copy: bool = True) -> Dict[str, torch.Tensor]:
    if device is not None and device.type == "cuda" and torch.cuda.is_available() and library_has_cuda():
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if _hbm_backend(c) == "cuda" and not copy:
            return _hbm_state(c, id, device)
        return _cuda_state(c, id, device)
    # A libcairn without CUDA: through host memory.
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
    memory (no copy at all; the device leases last as long as the tensors; a module copies from
    them). Those tensors are the copy every process on the GPU shares: do not write them (PyTorch
    cannot mark a CUDA tensor read-only); ``copy=True`` gives tensors of your own, copied on the
    device from the shared ones. Otherwise a CUDA device is filled straight from the daemon's shared memory
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
    if dev is not None and dev.type == "cuda" and torch.cuda.is_available() and library_has_cuda() and \
            _hbm_backend(c) == "cuda":
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        with torch.no_grad():
            if _read_into_cuda_module(c, id, module, dev):
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
        threading.Thread(target=run, name=f"cairn-checkpoint-{self.model_id}").start()

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
