"""The cairn client: a connection to the node's cairnd (libcairn's C API through ctypes)."""
from __future__ import annotations

import collections
import contextlib
import ctypes
import json
import os
import threading
import time
import weakref
from typing import Any, Callable, Deque, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Set, Tuple, Union

import numpy as np

from . import _dtypes, _errors, _ffi
from ._errors import CairnError
from ._args import (_SLICE_MS, _arena_array, _check, _durability, _json, _name, _shape_arg, _shutdown, _slices,
                    _timeout_ms)

PathLike = Union[str, "os.PathLike[str]"]
# libcairn sends tensors up to this size inline in the request (api/cpp/client.hpp, kInlineLimit).
_INLINE_LIMIT = 64 * 1024


class DeviceArray:
    """A C-contiguous tensor in device memory (a GPU buffer, or this process's memory with the
    daemon's emulated HBM backend) for :meth:`Client.save_model`: stored with
    cairn_model_add_tensor_device, copied device-to-host straight into the daemon's arena before
    save_model returns (docs/gpu.md). ``ptr`` is the device address, ``dtype`` a cairn dtype name
    ("F32", "BF16", ...), ``owner`` any object that keeps the memory alive until then."""

    __slots__ = ("ptr", "shape", "dtype", "nbytes", "ndim", "owner")

    def __init__(self, ptr: int, shape: Sequence[int], dtype: str, owner: Any = None) -> None:
        self.ptr = int(ptr)
        self.shape = tuple(int(x) for x in shape)
        self.ndim = len(self.shape)
        if dtype not in _dtypes.ITEMSIZE:
            raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                                f"invalid argument: DeviceArray dtype {dtype!r} is not one of {', '.join(_dtypes.ITEMSIZE)}")
        self.dtype = dtype
        n = 1
        for x in self.shape:
            n *= x
        self.nbytes = n * _dtypes.ITEMSIZE[dtype]
        self.owner = owner


class _Connection:
    """Owns the cairn_client. Every C call on it holds ``lock`` (the C API wants one thread at a time).

    Zero-copy arrays keep this object alive through their lease (see _Lease), so the connection --
    and with it the arena mapping their bytes live in -- ends only after the last of them is gone,
    whenever Client.close() is called.
    """

    def __init__(self, lib: ctypes.CDLL, handle: ctypes.c_void_p, address: str) -> None:
        self.lib = lib
        self.handle = handle
        self.address = address
        self.lock = threading.RLock()
        # Readers whose arrays died while another thread held the lock: closed by the next holder.
        self.pending: Deque[int] = collections.deque()
        self.open_readers: Set[int] = set()
        # Uncommitted model writers (ModelWriter), and those dropped while another thread held the
        # lock: aborted by the next holder.
        self.open_writers: Set[int] = set()
        self.pending_aborts: Deque[int] = collections.deque()
        self.closed = False
        self._end = weakref.finalize(self, _shutdown, lib, handle, self.pending)
        self._end.atexit = False  # at exit the process's end closes the socket; arrays may still be alive

    def _drain(self) -> None:
        # REQUIRES: lock held.
        while self.pending_aborts:
            w = self.pending_aborts.popleft()
            if w in self.open_writers:
                self.open_writers.discard(w)
                self.lib.cairn_model_abort(w)
        while self.pending:
            h = self.pending.popleft()
            self.open_readers.discard(h)
            self.lib.cairn_model_close(h)
        if self.closed and not self.open_readers:
            self._end()

    @contextlib.contextmanager
    def op(self) -> Iterator[ctypes.c_void_p]:
        """Holds the lock around one operation on the live connection."""
        try:
            with self.lock:
                if self.closed or not self.handle.value:
                    raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                                        f"invalid argument: this cairn client (socket {self.address}) was closed")
                self._drain()
                try:
                    yield self.handle
                finally:
                    self._drain()
        finally:
            self._drain_if_free()

    def _drain_if_free(self) -> None:
        if (self.pending or self.pending_aborts) and self.lock.acquire(blocking=False):
            try:
                self._drain()
            finally:
                self.lock.release()

    def release_reader(self, reader: int) -> None:
        """Closes a reader whose last array is gone (called by the garbage collector, any thread)."""
        self.pending.append(reader)  # first, so that a thread holding the lock sees it when it lets go
        self._drain_if_free()

    def abort_writer(self, writer: int) -> None:
        """Aborts a model writer dropped uncommitted (called by the garbage collector, any thread)."""
        self.pending_aborts.append(writer)
        self._drain_if_free()

    def close(self) -> None:
        with self.lock:
            self.closed = True
            # A writer must end before its client: the models still being written are dropped.
            self.pending_aborts.extend(self.open_writers)
            self._drain()  # ends the connection now unless zero-copy arrays are still alive


class _Lease:
    """Stands for one open model reader (its leases). The arrays of a zero-copy load reference it
    through their base buffers; when the last of them is collected, the reader is closed and the
    daemon releases the leases."""

    __slots__ = ("reader", "__weakref__")

    def __init__(self, conn: _Connection, reader: int) -> None:
        self.reader = reader
        fin = weakref.finalize(self, conn.release_reader, reader)
        fin.atexit = False


class _View:
    """The base object of one zero-copy array: describes the leased bytes to numpy (read-only, so
    the array can never be made writable, unless they are a copy-on-write view) and holds the lease."""

    __slots__ = ("__array_interface__", "lease")

    def __init__(self, addr: int, shape: Tuple[int, ...], dtype: np.dtype, lease: _Lease,
                 writable: bool = False) -> None:
        self.__array_interface__ = {"version": 3, "data": (addr, not writable), "shape": shape,
                                    "typestr": dtype.str}
        self.lease = lease


def _free_ticket(lib: ctypes.CDLL, handle: ctypes.c_void_p) -> None:
    if handle.value:
        lib.cairn_ticket_free(handle)
        handle.value = None


class Ticket:
    """The progress of one commit towards its durability.

    ``save_model`` above ``"memory"`` returns once the model is visible (in the daemon's memory);
    ``wait()`` blocks until the requested durability is reached. At ``"memory"`` without ``wait``
    the commit is *pipelined*: ``save_model`` returns as soon as the request is written, and the
    commit's own outcome (AlreadyExists, a missing parent, ...) is raised by ``wait()`` -- never by
    another call. Until then ``reached`` is ``"sent"``. Later calls of the same client see the model
    (requests are served in order); other clients see it once its reply was collected (``wait()``,
    :meth:`Client.flush_pipeline`, or any later call of this client that needs a reply).
    Tickets belong to their client's connection: a ticket that is not waited for before the client
    closes is forgotten (the daemon still flushes the model; a pipelined commit's error then comes
    from :meth:`Client.flush_pipeline`).
    """

    def __init__(self, conn: _Connection, handle: Optional[ctypes.c_void_p], model_id: str, durability: str,
                 reached: str) -> None:
        self._conn = conn
        self._handle = handle
        self._error: Optional[CairnError] = None
        self._reached = reached
        #: The model the ticket is for.
        self.model_id = model_id
        #: The durability asked for: "memory", "local" or "global".
        self.durability = durability
        if handle is not None:
            weakref.finalize(self, _free_ticket, conn.lib, handle).atexit = False

    @property
    def reached(self) -> str:
        """The level known to be reached: ``"sent"`` for a pipelined commit whose reply has not been
        collected, ``"memory"`` after the commit, the requested durability once ``wait()`` succeeded. (``"local"`` is reached together with ``"global"`` until the NVMe tier
        exists; the C API does not report the higher level, so this says ``"local"``.)"""
        return self._reached

    @property
    def done(self) -> bool:
        """True once the requested durability is reached (or the flush failed)."""
        return self._handle is None or not self._handle.value

    def wait(self, timeout: Optional[float] = None) -> str:
        """Waits up to ``timeout`` seconds (None: forever) for the durability; returns ``reached``.

        Raises Timeout if not reached yet (wait again later), or the error of writing the model to
        the repository (the model is then gone)."""
        if self._error is not None:
            raise self._error
        if self.done:
            return self._reached
        assert self._handle is not None
        err: Optional[CairnError] = None
        for ms in _slices(_timeout_ms(timeout)):
            with self._conn.op():
                st = self._conn.lib.cairn_wait(self._handle, ms)
                err = _errors.last_error(st) if st != 0 else None
            if not isinstance(err, _errors.Timeout):
                break
        if err is None:
            self._reached = self.durability
        elif isinstance(err, _errors.Timeout):
            if timeout is not None and timeout * 1000 > _SLICE_MS:  # the daemon's message names the last slice
                err = _errors.make_error(err.code, f"{err.message} (after {timeout:g} s in all)")
            raise err
        else:
            self._error = err
        _free_ticket(self._conn.lib, self._handle)
        if err is not None:
            raise err
        return self._reached

    def __repr__(self) -> str:
        return f"<cairn.Ticket {self.model_id!r} durability={self.durability!r} reached={self._reached!r}>"


class ModelWriter:
    """A model being written: tensors go into the daemon's shared arena as they are added, and
    nothing of the model is visible to anyone until :meth:`commit`. :meth:`abort` -- or leaving a
    ``with`` block on an exception, or dropping the writer uncommitted -- drops the model and frees
    its arena space. Get one from :meth:`Client.writer`.

    Besides copying arrays in (:meth:`add`, :meth:`add_many`), a writer hands out arena space to
    fill in place (:meth:`space`): the caller writes the tensor's bytes straight into the memory
    the model is committed from, with no copy of its own (what an asynchronous checkpoint stages
    into). Such space is writable until the commit or abort returns, and must not be written after
    :meth:`seal` or the commit -- the stored model would no longer match its hashes.

    Calls on one writer hold its client's lock one at a time; a writer is not for use by several
    threads at once. Its client must stay open until it is committed or aborted (closing the client
    aborts it).
    """

    def __init__(self, conn: _Connection, handle: int, id: str, parent: Optional[str],
                 part: Optional[Tuple[int, int]]) -> None:
        self._conn = conn
        self._handle = handle
        conn.open_writers.add(handle)
        self._end = weakref.finalize(self, conn.abort_writer, handle)
        self._end.atexit = False  # at exit the daemon frees the space of the lost connection
        #: The model's id.
        self.id = id
        #: The parent it derives from, or None.
        self.parent = parent
        #: ``(index, count)`` for a part of a multi-part model, else None.
        self.part = part
        self._names: Set[str] = set()

    @property
    def open(self) -> bool:
        """True until the model is committed or aborted (or its client closed)."""
        return self._handle in self._conn.open_writers

    @contextlib.contextmanager
    def _op(self) -> Iterator[int]:
        with self._conn.op():
            if not self.open:
                raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                                    f"invalid argument: the writer of model {self.id!r} was committed or aborted")
            yield self._handle

    def _new_name(self, name: str) -> bytes:
        b = _name(name, "tensor name")
        if name in self._names:
            raise _errors.error("CAIRN_ERR_EXISTS", f"already exists: model {self.id!r}: tensor {name!r} was already added")
        return b

    def add(self, name: str, array: Any, dtype: _dtypes.DTypeLike = None) -> None:
        """Adds tensor ``name``: its bytes are copied into the arena (and hashed) before this returns,
        so the caller may change ``array`` afterwards. ``array``: anything numpy takes (a
        non-contiguous or big-endian array is converted on its way into arena space, without a copy
        of its own), or a :class:`DeviceArray` (copied device-to-host straight into the arena).
        ``dtype``: a cairn dtype for raw bits (``"BF16"`` for uint16 bits, ...)."""
        nb = self._new_name(name)
        what = f"tensor {name!r}"
        if isinstance(array, DeviceArray):
            with self._op() as w:
                _check(self._conn.lib.cairn_model_add_tensor_device(w, nb, array.ptr, _dtypes.code(array.dtype),
                                                                    array.ndim, _shape_arg(array.shape)))
            self._names.add(name)
            return
        a = np.asarray(array)
        dt = _dtypes.cairn_dtype(a.dtype, dtype, what)
        if a.nbytes > _INLINE_LIMIT and (not a.flags.c_contiguous or a.dtype.byteorder == ">"):
            # Copied (and converted) once, straight into arena space, then hashed by the library.
            dst = self.space(name, dt, a.shape)
            np.copyto(dst.view(a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype), a, casting="equiv")
            self.seal(name)
            return
        self.add_many({name: a}, {name: dt})

    def add_many(self, tensors: Mapping[str, Any], dtypes: Optional[Mapping[str, _dtypes.DTypeLike]] = None) -> None:
        """Adds several tensors with one call (``cairn_model_add_tensors``): their copies into the
        arena, and the hashing, are shared among up to 4 threads (see :meth:`Client.writer`'s
        ``copy_threads``). Arrays are made C-contiguous and little-endian first where they are not
        (a copy); every argument is checked before anything is added."""
        dtypes = dtypes or {}
        run = []
        seen: Set[str] = set()
        for name, array in tensors.items():
            nb = self._new_name(name)
            if name in seen:
                raise _errors.error("CAIRN_ERR_EXISTS", f"already exists: model {self.id!r}: tensor {name!r} is given twice")
            seen.add(name)
            a, dt = _dtypes.prepare(array, dtypes.get(name), f"tensor {name!r}")
            run.append((nb, a, _dtypes.code(dt)))
        if not run:
            return
        shapes = [_shape_arg(a.shape) for _, a, _ in run]  # kept alive through the call
        arr = (_ffi.TensorIn * len(run))()
        for i, (nb, a, code) in enumerate(run):
            arr[i] = _ffi.TensorIn(nb, a.ctypes.data, code, a.ndim, shapes[i])
        with self._op() as w:
            _check(self._conn.lib.cairn_model_add_tensors(w, arr, len(run)))
        self._names.update(seen)

    def space(self, name: str, dtype: _dtypes.DTypeLike, shape: Sequence[int]) -> np.ndarray:
        """Adds tensor ``name`` of cairn dtype (or numpy dtype) ``dtype`` and ``shape`` and returns
        its arena space as a writable, C-contiguous array (BF16 and FP8 as raw uint16/uint8 bits):
        fill it before the commit; its bytes are what is committed. NoSpace when the arena cannot
        hold it. Valid until the commit or abort returns; :meth:`seal` it once filled."""
        nb = self._new_name(name)
        if isinstance(dtype, str) and dtype.upper() in _dtypes.ITEMSIZE:
            dt = dtype.upper()
        else:
            try:
                dt = _dtypes.cairn_dtype(np.dtype(dtype), None, f"tensor {name!r}")
            except TypeError:
                raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                                    f"invalid argument: tensor {name!r}: unknown dtype {dtype!r}") from None
        dims = tuple(int(x) for x in shape)
        p = ctypes.c_void_p()
        with self._op() as w:
            _check(self._conn.lib.cairn_model_add_tensor_space(w, nb, _dtypes.code(dt), len(dims), _shape_arg(dims),
                                                               ctypes.byref(p)))
        self._names.add(name)
        npdt = _dtypes.numpy_dtype(dt)
        if not p.value:
            return np.empty(dims, npdt)  # an empty tensor has no bytes to fill
        return _arena_array(p.value, dims, npdt)

    def seal(self, name: str) -> None:
        """Says that the space of tensor ``name`` (from :meth:`space`) holds its final bytes: the
        library hashes them now on its threads, while the caller goes on, so the commit need not.
        Optional; the bytes must not change afterwards."""
        with self._op() as w:
            _check(self._conn.lib.cairn_model_seal_tensor(w, _name(name, "tensor name")))

    def inherit(self, names: Union[str, Iterable[str]]) -> None:
        """Keeps the parent's tensors ``names`` unchanged: no bytes, no hashing."""
        for name in [names] if isinstance(names, str) else list(names):
            nb = self._new_name(name)
            with self._op() as w:
                _check(self._conn.lib.cairn_model_inherit_tensor(w, nb))
            self._names.add(name)

    def inherit_all(self) -> None:
        """Keeps every parent tensor not added or inherited by name (after them, in the parent's
        order). Not for a part of a multi-part model."""
        with self._op() as w:
            _check(self._conn.lib.cairn_model_inherit_all(w))

    def reserve(self, sizes: Sequence[int]) -> None:
        """Allocates the arena space of tensors over 64 KiB about to be added, ``sizes`` in bytes,
        with one request (each later add or :meth:`space` of such a size takes one; what is left is
        freed at the commit). NoSpace when the arena cannot hold them all."""
        n = len(sizes)
        if n:
            with self._op() as w:
                _check(self._conn.lib.cairn_model_reserve(w, n, (ctypes.c_size_t * n)(*[int(x) for x in sizes])))

    def set_architecture(self, arch: Mapping[str, Any]) -> None:
        """The architecture graph (docs/graph-format.md), a JSON object."""
        payload = _json(dict(arch), "arch")
        with self._op() as w:
            _check(self._conn.lib.cairn_model_set_architecture(w, payload))

    def set_metadata(self, meta: Mapping[str, Any]) -> None:
        """Metadata, a JSON object (for a part: merged with the other parts')."""
        payload = _json(dict(meta), "meta")
        with self._op() as w:
            _check(self._conn.lib.cairn_model_set_metadata(w, payload))

    def commit(self, durability: str = "global", *, wait: bool = False, pipelined: bool = False) -> Ticket:
        """Commits the model (or this part of it) and returns a :class:`Ticket` for its durability;
        the writer is finished, whatever the outcome. As :meth:`Client.save_model`: ``wait`` blocks
        until ``durability`` is reached; without it the call returns once the model is visible, or
        -- at ``"memory"`` (not a part), or with ``pipelined`` -- as soon as the request is written,
        the commit's own errors then coming from the ticket's ``wait()``. A part's ticket follows
        the whole model: its ``wait()`` raises when another part is missing after the part timeout."""
        level = _durability(durability)
        with self._op() as w:
            self._conn.open_writers.discard(w)  # the commit frees the C writer, whatever its result
            self._end.detach()
            if wait:
                _check(self._conn.lib.cairn_model_commit(w, level, None))
                return Ticket(self._conn, None, self.id, durability, durability)
            t = ctypes.c_void_p()
            if pipelined:
                _check(self._conn.lib.cairn_model_commit_pipelined(w, level, ctypes.byref(t)))
            else:
                _check(self._conn.lib.cairn_model_commit(w, level, ctypes.byref(t)))
        sent = pipelined or (durability == "memory" and self.part is None)
        return Ticket(self._conn, t, self.id, durability, "sent" if sent else "memory")

    def abort(self) -> None:
        """Drops the model (nothing of it becomes visible; for a part, the other parts' tickets fail
        when the part timeout passes) and frees its arena space (space reserved and never used goes
        back with the client's next request). Does nothing once committed."""
        with self._conn.lock:
            if self._handle in self._conn.open_writers:
                self._conn.open_writers.discard(self._handle)
                self._end.detach()
                self._conn.lib.cairn_model_abort(self._handle)

    def __enter__(self) -> "ModelWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.abort()  # committed: nothing to do; otherwise (an exception, or no commit) dropped

    def __repr__(self) -> str:
        part = f" part {self.part[0]} of {self.part[1]}" if self.part else ""
        return f"<cairn.ModelWriter {self.id!r}{part} {'open' if self.open else 'finished'}>"


TensorInfo = Tuple[str, str, Tuple[int, ...], int]  # name, cairn dtype, shape, nbytes


class ModelReader:
    """An open model (``cairn_model_open``): its tensor list, and reads of its tensors into this
    process's memory (zero-copy views, copies, the caller's arrays) or into device memory.

    Get one from :meth:`Client.open_model`; close it (or use it as a context manager) when done.
    Zero-copy arrays from :meth:`map` keep the model's tensors leased past ``close()``: the reader
    behind them ends when the last of them is garbage collected. Not for use by several threads at
    once (the calls on one connection are serialised anyway)."""

    def __init__(self, conn: _Connection, handle: int, id: str) -> None:
        self._conn = conn
        self.id = id
        self._lease: Optional[_Lease] = _Lease(conn, handle)  # closes the C reader once unreferenced
        conn.open_readers.add(handle)
        self._tensors = self._infos(handle)
        self._by_name = {t[0]: t for t in self._tensors}

    def _infos(self, r: int) -> List[TensorInfo]:
        lib = self._conn.lib
        count = ctypes.c_size_t()
        _check(lib.cairn_model_tensor_count(r, ctypes.byref(count)))
        out: List[TensorInfo] = []
        for i in range(count.value):
            name, dt, nd, n = ctypes.c_char_p(), ctypes.c_int(), ctypes.c_int(), ctypes.c_size_t()
            shape = (ctypes.c_int64 * _ffi.MAX_DIMS)()
            _check(lib.cairn_model_tensor_info(r, i, ctypes.byref(name), ctypes.byref(dt), ctypes.byref(nd), shape,
                                               ctypes.byref(n)))
            out.append(((name.value or b"").decode("utf-8"), _dtypes.name_of_code(dt.value), tuple(shape[: nd.value]),
                        n.value))
        return out

    @property
    def tensors(self) -> List[TensorInfo]:
        """``(name, cairn dtype, shape, nbytes)`` of every tensor, in the model's order."""
        return list(self._tensors)

    def info(self, name: str) -> TensorInfo:
        """``(name, cairn dtype, shape, nbytes)`` of tensor ``name``; NotFound naming model and tensor."""
        t = self._by_name.get(name)
        if t is None:
            raise _errors.error("CAIRN_ERR_NOT_FOUND", f"not found: model {self.id!r} has no tensor {name!r}")
        return t

    def _select(self, names: Optional[Iterable[str]]) -> List[TensorInfo]:
        if names is None:
            return list(self._tensors)
        wanted = [names] if isinstance(names, str) else list(names)
        return [self.info(n) for n in dict.fromkeys(wanted)]

    @contextlib.contextmanager
    def _op(self) -> Iterator[int]:
        """The connection's lock around one call on this (open) reader."""
        with self._conn.op():
            if self._lease is None:
                raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                                    f"invalid argument: the reader of model {self.id!r} was closed")
            yield self._lease.reader

    def map(self, names: Optional[Iterable[str]] = None, writable: bool = False) -> Dict[str, np.ndarray]:
        """Tensors (all, or ``names``) as zero-copy views of the daemon's arena, leased with one
        request (``cairn_model_map_tensors``). Read-only, or with ``writable=True`` copy-on-write
        views (a write copies the touched page into this process and never changes the stored model).
        BF16 and FP8 come back as raw uint16/uint8 bits. The views keep the tensors leased while
        any of them (or a view of one) is alive, past :meth:`close`."""
        infos = self._select(names)
        count = len(infos)
        ptrs = (ctypes.c_void_p * count)()
        lens = (ctypes.c_size_t * count)()
        with self._op() as r:
            lease = self._lease
            if count:
                lib = self._conn.lib
                mapper = lib.cairn_model_map_tensors_private if writable else lib.cairn_model_map_tensors
                _check(mapper(r, count, _names_array([t[0] for t in infos]), ptrs, lens))
        out: Dict[str, np.ndarray] = {}
        for i, (name, dt, shape, nbytes) in enumerate(infos):
            if lens[i] != nbytes or (nbytes and not ptrs[i]):
                raise _errors.error("CAIRN_ERR_PROTOCOL",
                                    f"protocol error: tensor {name!r} was mapped with {lens[i]} bytes, not {nbytes}")
            npdt = _dtypes.numpy_dtype(dt)
            arr = np.empty(shape, npdt) if nbytes == 0 else np.asarray(_View(ptrs[i] or 0, shape, npdt, lease, writable))
            if not writable:
                arr.flags.writeable = False
            out[name] = arr
        return out

    def read(self, names: Optional[Iterable[str]] = None) -> Dict[str, np.ndarray]:
        """Tensors (all, or ``names``) copied into new, writable arrays with one request; nothing
        stays leased. BF16 and FP8 come back as raw uint16/uint8 bits."""
        infos = self._select(names)
        out = {name: np.empty(shape, _dtypes.numpy_dtype(dt)) for name, dt, shape, _ in infos}
        self.read_into(out)
        return out

    def read_into(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Copies tensors into the caller's arrays with one request (``cairn_model_read_tensors``):
        ``arrays`` maps tensor names to writable, C-contiguous arrays of exactly the tensor's size in
        bytes (any dtype). One copy, straight into that memory."""
        items = list(arrays.items())
        for name, a in items:
            info = self.info(name)
            if not isinstance(a, np.ndarray) or not a.flags.c_contiguous or not a.flags.writeable:
                raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                                    f"invalid argument: the array for tensor {name!r} is not a writable C-contiguous ndarray")
            if a.nbytes != info[3]:
                raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                                    f"invalid argument: tensor {name!r} of model {self.id!r} has {info[3]} bytes, "
                                    f"the array {a.nbytes}")
        self._read(self._conn.lib.cairn_model_read_tensors, [(n, a.ctypes.data, a.nbytes) for n, a in items])

    def _read(self, fn: Any, targets: Sequence[Tuple[str, int, int]]) -> None:
        if not targets:
            return
        count = len(targets)
        with self._op() as r:
            _check(fn(r, count, _names_array([t[0] for t in targets]),
                      (ctypes.c_void_p * count)(*[t[1] for t in targets]),
                      (ctypes.c_size_t * count)(*[t[2] for t in targets])))

    def read_device(self, targets: Sequence[Tuple[str, int, int]]) -> None:
        """Copies tensors into device memory with one request (``cairn_model_read_tensors_device``):
        ``targets`` are ``(name, device address, nbytes)``, each exactly the tensor's size. With the
        daemon's HBM tier the copies are device-to-device, back to back; otherwise a library built
        with CUDA (:func:`library_has_cuda`) copies from the arena. Unavailable when neither can."""
        for name, _, nbytes in targets:
            if self.info(name)[3] != nbytes:
                raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                                    f"invalid argument: tensor {name!r} of model {self.id!r} has "
                                    f"{self.info(name)[3]} bytes, the device buffer {nbytes}")
        self._read(self._conn.lib.cairn_model_read_tensors_device, targets)

    def map_device(self, names: Optional[Iterable[str]] = None, device: int = -1) -> Dict[str, Tuple[int, int, Any]]:
        """Tensors (all non-empty ones, or ``names``) as zero-copy views of the daemon's copies in its
        HBM tier on ``device`` (-1: its first), leased with one request
        (``cairn_model_map_tensors_device``, CUDA IPC): name -> ``(device address, nbytes, keeper)``.
        The leases last while any ``keeper`` is referenced (hold it as long as the memory is used).
        Unavailable when the daemon has no HBM tier."""
        infos = [t for t in self._select(names) if t[3]]
        count = len(infos)
        ptrs = (ctypes.c_void_p * count)()
        sizes = (ctypes.c_size_t * count)()
        with self._op() as r:
            lease = self._lease
            if count:
                _check(self._conn.lib.cairn_model_map_tensors_device(r, count, _names_array([t[0] for t in infos]),
                                                                     int(device), ptrs, sizes))
        return {t[0]: (ptrs[i] or 0, sizes[i], lease) for i, t in enumerate(infos)}

    def close(self) -> None:
        """Ends this reader; arrays from :meth:`map` keep its leases until they are gone."""
        self._lease = None  # the C reader closes when no view refers to the lease any more

    def __enter__(self) -> "ModelReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ModelReader({self.id!r}, {len(self._tensors)} tensors{'' if self._lease else ', closed'})"


def _names_array(names: Sequence[str]) -> Any:
    arr = (ctypes.c_char_p * len(names))()
    arr[:] = [n.encode("utf-8") for n in names]
    return arr


def library_has_cuda() -> bool:
    """Whether the loaded libcairn was built with CUDA (``cairn_library_has_cuda``): it can copy
    between the daemon's arena and CUDA device memory itself."""
    return bool(_ffi.library().cairn_library_has_cuda())


class Client:
    """A connection to the node's cairnd. Create one with :func:`cairn.connect`.

    Every method raises :class:`cairn.CairnError` (a subclass per status) on failure. A client may be
    shared by threads (calls are serialised), but one client per thread is faster. Use it as a
    context manager, or call :meth:`close`.
    """

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn

    # ---- connection ----

    @property
    def address(self) -> str:
        """The daemon's socket path."""
        return self._conn.address

    @property
    def closed(self) -> bool:
        return self._conn.closed

    def close(self) -> None:
        """Ends the connection. Arrays from ``load_model(copy=False)`` stay valid: the connection (and
        their leases) ends once the last of them is garbage collected."""
        self._conn.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<cairn.Client {self.address!r}{' closed' if self.closed else ''}>"

    @property
    def _lib(self) -> ctypes.CDLL:
        return self._conn.lib

    # ---- named tensors ----

    def put_tensor(self, key: str, array: Any, dtype: _dtypes.DTypeLike = None) -> None:
        """Stores (or replaces) ``array`` under ``key`` (a named tensor, kept in the daemon's DRAM
        until deleted or replaced; not a model). ``dtype``: a cairn dtype name to store raw bits as
        (``"BF16"`` for uint16 bits, ``"F8_E4M3"``/``"F8_E5M2"`` for uint8 bits)."""
        k = _name(key, "key")
        a, dt = _dtypes.prepare(array, dtype, f"tensor {key!r}")
        with self._conn.op() as h:
            _check(self._lib.cairn_put_tensor(h, k, a.ctypes.data, _dtypes.code(dt), a.ndim, _shape_arg(a.shape)))

    def tensor_info(self, key: str) -> Tuple[str, Tuple[int, ...], int]:
        """(cairn dtype name, shape, nbytes) of the named tensor ``key``."""
        k = _name(key, "key")
        with self._conn.op() as h:
            return self._info(h, k)

    def _info(self, h: ctypes.c_void_p, k: bytes) -> Tuple[str, Tuple[int, ...], int]:
        dt, nd, n = ctypes.c_int(), ctypes.c_int(), ctypes.c_size_t()
        shape = (ctypes.c_int64 * _ffi.MAX_DIMS)()
        _check(self._lib.cairn_get_tensor_info(h, k, ctypes.byref(dt), ctypes.byref(nd), shape, ctypes.byref(n)))
        return _dtypes.name_of_code(dt.value), tuple(shape[: nd.value]), n.value

    def get_tensor(self, key: str) -> np.ndarray:
        """A copy of the named tensor ``key`` as a new, writable array (BF16 and FP8 come back as
        raw uint16/uint8 bits; see :data:`cairn.RAW_DTYPES`)."""
        k = _name(key, "key")
        got: List[np.ndarray] = []

        def alloc(_ctx: Any, dtype: int, ndim: int, shape: Any, nbytes: int) -> int:
            # Called by cairn_unpack_tensor_alloc with the tensor's description: one round trip.
            try:
                a = np.empty(tuple(shape[i] for i in range(ndim)), _dtypes.numpy_dtype(_dtypes.name_of_code(dtype)))
            except Exception:  # an unknown dtype: no buffer (CAIRN_ERR_NO_SPACE) rather than a crash
                return 0
            if a.nbytes != nbytes:
                return 0
            got.append(a)
            return a.ctypes.data or 1  # not NULL, also for an empty tensor
        with self._conn.op() as h:
            _check(self._lib.cairn_unpack_tensor_alloc(h, k, _ffi.ALLOC_FN(alloc), None))
        return got[0]

    def poll_tensor(self, key: str, timeout: Optional[float] = 0.0) -> bool:
        """Waits up to ``timeout`` seconds (0: do not wait, None: forever) for ``key`` to exist; returns
        whether it does."""
        k = _name(key, "key")
        found = ctypes.c_int()
        for ms in _slices(_timeout_ms(timeout)):
            with self._conn.op() as h:
                _check(self._lib.cairn_poll_tensor(h, k, ms, ctypes.byref(found)))
            if found.value:
                break
        return bool(found.value)

    def delete_tensor(self, key: str) -> None:
        """Deletes the named tensor ``key`` (NotFound if there is none)."""
        k = _name(key, "key")
        with self._conn.op() as h:
            _check(self._lib.cairn_delete_tensor(h, k))

    # ---- models ----

    def save_model(
        self,
        id: str,
        tensors: Mapping[str, Any],
        parent: Optional[str] = None,
        arch: Optional[Mapping[str, Any]] = None,
        meta: Optional[Mapping[str, Any]] = None,
        durability: str = "global",
        inherit: Iterable[str] = (),
        *,
        dtypes: Optional[Mapping[str, _dtypes.DTypeLike]] = None,
        wait: bool = False,
        inherit_all: bool = False,
        order: Optional[Sequence[str]] = None,
        part: Optional[Tuple[int, int]] = None,
        part_timeout: Optional[float] = None,
        pipelined: bool = False,
        before_commit: Optional[Callable[[], None]] = None,
        copy_threads: int = 0,
    ) -> Ticket:
        """Commits model ``id`` and returns a :class:`Ticket` for its durability.

        Args:
            id: the new model's id (ids are immutable: AlreadyExists if taken).
            tensors: name -> array. Each array's bytes are copied once, into the daemon's shared
                arena (a non-contiguous or big-endian array over 64 KiB is copied straight into
                arena space, converted on the way). The model's tensors are these, in this order,
                then the inherited ones. A :class:`DeviceArray` (a tensor in GPU memory) is copied
                device-to-host straight into the arena.
            parent: the model it derives from (its provenance; needed for ``inherit``).
            arch: the architecture graph (docs/graph-format.md), a JSON object.
            meta: metadata, a JSON object (score, epoch, task, tags, ...).
            durability: ``"memory"``, ``"local"`` or ``"global"`` -- what ``Ticket.wait()`` waits for.
            inherit: names of the parent's tensors kept unchanged (no bytes sent, no hashing).
            dtypes: name -> cairn dtype for tensors given as raw bits (``{"w": "BF16"}``).
            wait: block until ``durability`` is reached before returning (the ticket is then done).
            inherit_all: also keep every other tensor of the parent (after ``tensors`` and
                ``inherit``, in the parent's order). With no ``tensors``, a metadata-only commit
                that stores no bytes.
            order: the model's tensor order, naming every tensor of ``tensors`` and ``inherit``
                once (new and inherited interleaved, e.g. a state dict's order). Default: ``tensors``
                in their order, then ``inherit``.
            part: ``(index, count)``: this call commits part ``index`` of a model that ``count``
                writers (ranks) commit at once, each with its own tensors; the model becomes visible
                when every part is in, at the weakest durability any part asked for. Without ``wait``
                the call returns at once and the ticket follows the whole model: its ``wait()``
                raises when a part is missing ``part_timeout`` seconds (default 60) after the first.

            pipelined: return as soon as the request is written, at any durability and for a part:
                the daemon hashes and registers the model behind the caller (the arrays may be
                changed once the call returns: their bytes are in the arena). The commit's own
                errors are raised by the ticket's ``wait()``. What a checkpoint that must not block
                uses.
            before_commit: called once every byte is in the arena, just before the commit is sent;
                an exception it raises aborts the model (nothing becomes visible; a part's writers
                see it as a part that never arrived) and is raised from here.
            copy_threads: the threads the copy into the arena may use (0: one per core, at most 4).

        Without ``wait`` the call returns once the model is visible (its bytes are in the daemon's
        memory); the daemon writes it to the repository behind the caller. At ``"memory"`` without
        ``wait`` (and with ``pipelined``) the commit is pipelined: the call returns once the request
        is written and errors of the commit itself are raised by the ticket's ``wait()`` (see
        :class:`Ticket`).
        """
        _durability(durability)
        inherit_names = [inherit] if isinstance(inherit, str) else list(inherit)
        dtypes = dtypes or {}
        prepared = []  # (name, array, cairn dtype, added alone: a DeviceArray, or converted in place)
        for name, array in tensors.items():
            _name(name, "tensor name")
            what = f"tensor {name!r}"
            if isinstance(array, DeviceArray):
                prepared.append((name, array, array.dtype, True))
                continue
            a = np.asarray(array)
            dt = _dtypes.cairn_dtype(a.dtype, dtypes.get(name), what)
            in_place = a.nbytes > _INLINE_LIMIT and (not a.flags.c_contiguous or a.dtype.byteorder == ">")
            prepared.append((name, a, dt, in_place))  # add_many makes the others contiguous where needed
        # The order of the calls below is the model's tensor order.
        steps: List[Tuple[str, Any]] = [(p[0], p) for p in prepared] + [(n, None) for n in inherit_names]
        if order is not None:
            by_name = {n: s for n, s in steps}
            wanted = list(order)
            if len(wanted) != len(by_name) or set(wanted) != set(by_name):
                raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                                    f"model {id!r}: 'order' must name each tensor of 'tensors' and 'inherit' once")
            steps = [(n, by_name[n]) for n in wanted]
        if arch is not None:
            _json(dict(arch), "arch")  # checked before any byte is copied
        if meta is not None:
            _json(dict(meta), "meta")
        with self.writer(id, parent, part=part, part_timeout=part_timeout, copy_threads=copy_threads) as w:
            # The arena space of every big tensor in one round trip.
            big = [p[1].nbytes for _, p in steps if p is not None and p[1].nbytes > _INLINE_LIMIT]
            if len(big) > 1:
                w.reserve(big)
            # Runs of tensors copied from the caller's arrays go in one call each: the library
            # copies (and hashes) all of a run's tensors on every core, not one at a time.
            run: Dict[str, np.ndarray] = {}
            run_dtypes: Dict[str, str] = {}

            def add_run() -> None:
                if run:
                    w.add_many(run, run_dtypes)
                    run.clear()
                    run_dtypes.clear()

            for name, step in steps:
                if step is None:
                    add_run()
                    w.inherit(name)
                elif not step[3]:
                    run[name], run_dtypes[name] = step[1], step[2]
                else:
                    # Device-to-host, or converted once, straight into arena space.
                    add_run()
                    w.add(name, step[1], step[2])
            add_run()
            if inherit_all:
                w.inherit_all()
            if arch is not None:
                w.set_architecture(arch)
            if meta is not None:
                w.set_metadata(meta)
            if before_commit is not None:
                before_commit()
            return w.commit(durability, wait=wait, pipelined=pipelined)

    def writer(self, id: str, parent: Optional[str] = None, *, part: Optional[Tuple[int, int]] = None,
               part_timeout: Optional[float] = None, copy_threads: int = 0) -> "ModelWriter":
        """Starts model ``id`` (derived from ``parent``) and returns its :class:`ModelWriter`: add
        tensors (copied in, or written in place into arena space), then commit -- nothing is visible
        before. What :meth:`save_model` does in one call, for callers that fill the arena themselves
        (an asynchronous checkpoint staging a state dict) or add tensors as they come.

        ``part=(index, count)``: part ``index`` of a model that ``count`` writers commit at once
        (see :meth:`save_model`); ``part_timeout`` (seconds, default 60) after the first part
        arrives, a missing part fails the whole model. ``copy_threads``: the threads the copies into
        the arena may use (0: one per core, at most 4)."""
        mid = _name(id, "model id")
        par = _name(parent, "parent id") if parent is not None else None
        lib = self._lib
        with self._conn.op() as h:
            w = ctypes.c_void_p()
            if part is None:
                _check(lib.cairn_model_create(h, mid, par, ctypes.byref(w)))
            else:
                index, count = (int(x) for x in part)
                timeout_ms = int(part_timeout * 1000) if part_timeout is not None else 0
                _check(lib.cairn_model_create_part(h, mid, par, index, count, timeout_ms, ctypes.byref(w)))
            writer = ModelWriter(self._conn, w.value, id, parent,  # type: ignore[arg-type]
                                 None if part is None else (index, count))
        if copy_threads:
            with writer._op() as wh:
                _check(lib.cairn_model_set_copy_threads(wh, int(copy_threads)))
        return writer

    def flush_pipeline(self) -> None:
        """Collects the replies of every pipelined commit (``save_model`` at ``"memory"`` without
        ``wait``) still in flight, resolving their tickets; afterwards every commit of this client is
        visible to every client. Raises the first error of a pipelined commit whose ticket was
        garbage collected unwaited (errors of tickets still held are raised by their ``wait()``), or
        Unavailable when the connection was lost."""
        with self._conn.op() as h:
            _check(self._lib.cairn_pipeline_flush(h))

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet answered (pipelined commits)."""
        with self._conn.op() as h:
            return int(self._lib.cairn_pipeline_in_flight(h))

    def open_model(self, id: str) -> ModelReader:
        """Opens model ``id`` for reading (``cairn_model_open``): a :class:`ModelReader` with its
        tensor list and every way of reading its tensors. NotFound names a missing model."""
        mid = _name(id, "model id")
        with self._conn.op() as h:
            r = ctypes.c_void_p()
            _check(self._lib.cairn_model_open(h, mid, ctypes.byref(r)))
            try:
                return ModelReader(self._conn, r.value, id)  # type: ignore[arg-type]
            except BaseException:
                if r.value not in self._conn.open_readers:
                    self._lib.cairn_model_close(r)
                raise

    def load_model(self, id: str, names: Optional[Iterable[str]] = None, copy: bool = False,
                   writable: bool = False) -> Dict[str, np.ndarray]:
        """The tensors of model ``id`` (all, or ``names``), as name -> array in the model's order
        (or the order of ``names``).

        ``copy=False`` (default): read-only arrays that are views of the daemon's shared arena -- no
        copy. The tensors stay pinned in memory (leased) while any of these arrays, or a view of
        one, is alive; the lease ends when the last is garbage collected. ``copy=True``: new,
        writable arrays (one copy each) and nothing stays pinned. ``writable=True`` (without
        ``copy``): writable copy-on-write views -- no copy either; a write copies only the page it
        touches into this process and never changes the stored model (the arrays pin the tensors
        like the read-only views).

        BF16 and FP8 tensors come back as raw uint16/uint8 bits (see :data:`cairn.RAW_DTYPES`).
        """
        with self.open_model(id) as r:
            return r.read(names) if copy else r.map(names, writable=writable)

    def read_into(self, id: str, arrays: Mapping[str, np.ndarray]) -> None:
        """Copies tensors of model ``id`` into the caller's arrays with one request
        (``cairn_model_read_tensors``): ``arrays`` maps tensor names to writable, C-contiguous
        arrays of exactly the tensor's size in bytes (any dtype). One copy, straight into that memory."""
        with self.open_model(id) as r:
            r.read_into(arrays)

    def put_file(self, id: str, path: PathLike, parent: Optional[str] = None, durability: str = "global",
                 meta: Optional[Mapping[str, Any]] = None) -> None:
        """Stores the safetensors file ``path`` as model ``id`` (``cairn_model_put_file``: the file's
        tensors straight into the daemon's arena, its header kept so :meth:`get_file` gives the same
        bytes back), derived from ``parent``; returns once ``durability`` is reached. A file that is
        not valid safetensors is InvalidArgument naming what is wrong."""
        mid = _name(id, "model id")
        par = _name(parent, "parent id") if parent is not None else None
        level = _durability(durability)
        meta_json = _json(dict(meta), "meta") if meta is not None else None
        with self._conn.op() as h:
            _check(self._lib.cairn_model_put_file(h, mid, os.fsencode(path), par, level, meta_json))

    def get_file(self, id: str, path: PathLike) -> None:
        """Writes model ``id`` as the safetensors file ``path`` (``cairn_model_get_file``: straight
        from the daemon's arena into a temporary file renamed into place)."""
        mid = _name(id, "model id")
        with self._conn.op() as h:
            _check(self._lib.cairn_model_get_file(h, mid, os.fsencode(path)))

    def prefetch(self, id: str, all: bool = False) -> Optional[Dict[str, Any]]:
        """Asks the daemon to bring model ``id`` into DRAM ahead of need. With ``all=True``, into the
        DRAM of every member of the job's peer group at once (docs/peers.md); waits until all have
        it and returns the report: ``{"bytes", "seconds", "all_seconds", "all_ok", "members": [{"member",
        "ok", "bytes", "seconds", "error"}]}`` (a member that failed is listed, not raised)."""
        mid = _name(id, "model id")
        if all:
            return self._json_call("cairn_prefetch_all", mid)
        with self._conn.op() as h:
            _check(self._lib.cairn_prefetch(h, mid))
        return None

    # ---- catalog and queries ----

    def _json_call(self, function: str, payload: bytes) -> Dict[str, Any]:
        """Calls a C function taking (client, JSON text, char **result) and returns the parsed
        result, freeing it (cairn_request, cairn_query). A failure raises its CairnError."""
        out = ctypes.c_void_p()
        with self._conn.op() as h:
            _check(getattr(self._lib, function)(h, payload, ctypes.byref(out)))
            try:
                text = ctypes.string_at(out.value) if out.value else b"{}"
            finally:
                self._lib.cairn_free(out)
        return json.loads(text)

    def _request(self, request: Dict[str, Any]) -> Dict[str, Any]:
        """Sends one catalog/administration request (``cairn_request``); returns the response's
        fields (without ``status``). A failed response raises its CairnError."""
        return self._json_call("cairn_request", _json(request, "request"))

    def list(self) -> List[Dict[str, Any]]:
        """Every model: ``[{id, parent, tensors (count), bytes, created_ns, durability}]``, committed
        ones first (in commit order), then pending ones."""
        return list(self._request({"op": "list"}).get("models", []))

    def show(self, id: str) -> Dict[str, Any]:
        """Model ``id``: parent, children, durability, metadata, architecture, tensors (with chunks)..."""
        _name(id, "model id")
        return self._request({"op": "show", "id": id})

    def stats(self) -> Dict[str, Any]:
        """The daemon's statistics: ``tiers`` (per tier: capacity, used bytes, hits, misses, bytes in
        and out), ``repository`` (models, logical_bytes, physical_bytes, ...), ``flush`` (what is not
        yet in the repository, by stage), ``movement`` (reads per tier, demotions), ``recovery``,
        ``pending_models``, ``dirty_bytes``, ``chunk_size`` (docs/protocol.md)."""
        return self._request({"op": "stats"})

    def remove(self, id: str) -> None:
        """Removes model ``id``, as ``cairn rm`` does: it leaves :meth:`list` and the queries (the
        daemon decides what happens to its bytes and lineage)."""
        _name(id, "model id")
        self._request({"op": "remove", "id": id})

    def gc(self) -> Dict[str, Any]:
        """Collects removed models, as ``cairn gc`` does (waits for pending models to reach the
        repository first). Returns ``removed``, ``collected`` (ids), ``packs_deleted``,
        ``bytes_released``, ``bytes_punched``, ``bytes_unreclaimable``, ``physical_bytes``."""
        return self._request({"op": "gc"})

    def flush(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        """Waits until every acknowledged model is in the repository, as ``cairn flush`` does.
        ``timeout`` in seconds (None: no limit; past it :class:`cairn.Timeout` is raised). Returns
        ``flushed_models``, ``pending_models``, ``dirty_bytes``, ``seconds``."""
        req: Dict[str, Any] = {"op": "flush"}
        if timeout is not None:
            req["timeout_ms"] = int(timeout * 1000)
        return self._request(req)

    def fsck(self, verify: bool = True) -> Dict[str, Any]:
        """Checks the repository, as ``cairn fsck`` does; ``verify`` reads and hashes every referenced
        chunk. Returns ``ok``, ``models``, ``chunks``, ``bytes_verified``, ``dangling``, ``orphaned``,
        ``orphaned_bytes`` (docs/protocol.md)."""
        return self._request({"op": "fsck", "verify": bool(verify)})

    def hint(self, kind: str, models: Sequence[str], **fields: Any) -> Dict[str, Any]:
        """Tells the daemon what the workflow will read next (docs/policy.md); advice only.

        ``kind`` is ``"will_load"`` (fields ``tensors=[...]``, ``when=seconds`` or ``"next"``),
        ``"population"``, ``"sequence"`` (``ahead=k``) or ``"done"``. Returns the daemon's answer
        (``unknown`` lists ids that do not exist). A malformed hint raises CairnError naming the
        field."""
        h: Dict[str, Any] = {"kind": kind, "models": [models] if isinstance(models, str) else list(models)}
        h.update(fields)
        return self._json_call("cairn_hint", _json(h, "hint"))

    def query(self, request: Mapping[str, Any]) -> Dict[str, Any]:
        """Runs a catalog query (``cairn_query``), e.g. ``{"op": "ancestors", "model": "m7"}``;
        returns the daemon's answer."""
        return self._json_call("cairn_query", _json(dict(request), "query"))

    def lineage(self, id: str, depth: Optional[int] = None) -> Dict[str, Any]:
        """``{"model": id, "ancestors": [nearest first], "descendants": [breadth first]}``, up to
        ``depth`` generations each way (None: all)."""
        d = -1 if depth is None else int(depth)
        up = self.query({"op": "ancestors", "model": id, "depth": d})
        down = self.query({"op": "descendants", "model": id, "depth": d})
        return {"model": id, "ancestors": up.get("ancestors", []), "descendants": down.get("descendants", [])}

    def best_ancestor(self, arch: Mapping[str, Any], where: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
        """The stored model whose architecture matches the longest prefix of graph ``arch``
        (ties broken by metadata score), optionally among models whose metadata match ``where``
        (e.g. ``{"score": {">=": 0.9}}``). Returns the daemon's answer (docs/catalog.md).

        Sends ``{"op": "best_ancestor", "graph": arch, "where": where}`` (``where`` left out when None)
        through :meth:`query`; a daemon without the catalog index answers InvalidArgument
        ("... is not supported").
        """
        req: Dict[str, Any] = {"op": "best_ancestor", "graph": dict(arch)}
        if where is not None:
            req["where"] = dict(where)
        return self.query(req)


def connect(address: Optional[PathLike] = None) -> Client:
    """Connects to the node's cairnd.

    ``address`` is the daemon's Unix socket path; None means what the C API uses: ``$CAIRN_SOCKET``,
    else ``${XDG_RUNTIME_DIR:-/tmp}/cairn-$UID/cairnd.sock``. Raises :class:`cairn.Unavailable`
    (a CairnError) naming the socket path when no daemon listens there.
    """
    path = os.fspath(address) if address is not None else ""
    if not isinstance(path, str):
        path = os.fsdecode(path)
    lib = _ffi.library()
    handle = ctypes.c_void_p()
    st = lib.cairn_connect(os.fsencode(path) if path else None, ctypes.byref(handle))
    if st != 0:
        raise _errors.last_error(st)
    resolved = os.fsdecode(lib.cairn_client_address(handle) or b"")
    return Client(_Connection(lib, handle, resolved))
