"""Writing and reading one model in steps: ModelWriter (cairn_model_create .. cairn_model_commit_opts)
and ModelReader (cairn_model_open .. close), which Client.save_model and Client.load_model are built on."""
from __future__ import annotations

import contextlib
import ctypes
import weakref
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Set, Tuple, Union

import numpy as np

from . import _dtypes, _errors, _ffi
from ._args import _arena_array, _check, _deprecated, _durability, _json, _name, _shape_arg
from ._connection import _INLINE_LIMIT, DeviceArray, Ticket, _Connection, _Lease, _View


def _converted_in_arena(a: np.ndarray) -> bool:
    """Whether ``a`` is added alone, converted on its way into arena space (a non-contiguous or
    big-endian array too big to travel inline) rather than made contiguous first."""
    return a.nbytes > _INLINE_LIMIT and (not a.flags.c_contiguous or a.dtype.byteorder == ">")


class ModelWriter:
    """A model being written: tensors go into the daemon's shared arena as they are added, and
    nothing of the model is visible to anyone until :meth:`commit`. :meth:`abort` -- or leaving a
    ``with`` block on an exception, or dropping the writer uncommitted -- drops the model and frees
    its arena space. Get one from :meth:`Client.model_create`.

    Besides copying arrays in (:meth:`add_tensor`, :meth:`add_tensors`), a writer hands out arena
    space to fill in place (:meth:`add_tensor_space`): the caller writes the tensor's bytes straight into the memory
    the model is committed from, with no copy of its own (what an asynchronous checkpoint stages
    into). Such space is writable until the commit or abort returns, and must not be written after
    :meth:`seal_tensor` or the commit -- the stored model would no longer match its hashes.

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

    def add_tensor(self, name: str, array: Any, dtype: _dtypes.DTypeLike = None) -> None:
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
        if _converted_in_arena(a):
            # Copied (and converted) once, straight into arena space, then hashed by the library.
            dst = self.add_tensor_space(name, dt, a.shape)
            np.copyto(dst.view(a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype), a, casting="equiv")
            self.seal_tensor(name)
            return
        self.add_tensors({name: a}, {name: dt})

    def add_tensors(self, tensors: Mapping[str, Any], dtypes: Optional[Mapping[str, _dtypes.DTypeLike]] = None) -> None:
        """Adds several tensors with one call (``cairn_model_add_tensors``): their copies into the
        arena, and the hashing, are shared among up to 4 threads (see :meth:`Client.model_create`'s
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

    def add_tensor_space(self, name: str, dtype: _dtypes.DTypeLike, shape: Sequence[int]) -> np.ndarray:
        """Adds tensor ``name`` of cairn dtype (or numpy dtype) ``dtype`` and ``shape`` and returns
        its arena space as a writable, C-contiguous array (BF16 and FP8 as raw uint16/uint8 bits):
        fill it before the commit; its bytes are what is committed. NoSpace when the arena cannot
        hold it. Valid until the commit or abort returns; :meth:`seal_tensor` it once filled."""
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

    def seal_tensor(self, name: str) -> None:
        """Says that the space of tensor ``name`` (from :meth:`add_tensor_space`) holds its final bytes: the
        library hashes them now on its threads, while the caller goes on, so the commit need not.
        Optional; the bytes must not change afterwards."""
        with self._op() as w:
            _check(self._conn.lib.cairn_model_seal_tensor(w, _name(name, "tensor name")))

    def inherit_tensor(self, names: Union[str, Iterable[str]]) -> None:
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
        with one request (each later add or :meth:`add_tensor_space` of such a size takes one; what is left is
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
        # Not waited at "memory" (not a part), the commit is pipelined: there is nothing to wait for
        # beyond the reply.
        sent = not wait and (pipelined or (durability == "memory" and self.part is None))
        opts = _ffi.commit_options_for(level, int(bool(wait)), int(sent))
        with self._op() as w:
            self._conn.open_writers.discard(w)  # the commit frees the C writer, whatever its result
            self._end.detach()
            if wait:
                _check(self._conn.lib.cairn_model_commit_opts(w, ctypes.byref(opts), None))
                return Ticket(self._conn, None, self.id, durability, durability)
            t = ctypes.c_void_p()
            _check(self._conn.lib.cairn_model_commit_opts(w, ctypes.byref(opts), ctypes.byref(t)))
        return Ticket(self._conn, t, self.id, durability, "sent" if sent else "memory")

    def add(self, name: str, array: Any, dtype: _dtypes.DTypeLike = None) -> None:
        """Deprecated: :meth:`add_tensor`."""
        _deprecated("ModelWriter.add", "ModelWriter.add_tensor")
        self.add_tensor(name, array, dtype)

    def add_many(self, tensors: Mapping[str, Any], dtypes: Optional[Mapping[str, _dtypes.DTypeLike]] = None) -> None:
        """Deprecated: :meth:`add_tensors`."""
        _deprecated("ModelWriter.add_many", "ModelWriter.add_tensors")
        self.add_tensors(tensors, dtypes)

    def space(self, name: str, dtype: _dtypes.DTypeLike, shape: Sequence[int]) -> np.ndarray:
        """Deprecated: :meth:`add_tensor_space`."""
        _deprecated("ModelWriter.space", "ModelWriter.add_tensor_space")
        return self.add_tensor_space(name, dtype, shape)

    def seal(self, name: str) -> None:
        """Deprecated: :meth:`seal_tensor`."""
        _deprecated("ModelWriter.seal", "ModelWriter.seal_tensor")
        self.seal_tensor(name)

    def inherit(self, names: Union[str, Iterable[str]]) -> None:
        """Deprecated: :meth:`inherit_tensor`."""
        _deprecated("ModelWriter.inherit", "ModelWriter.inherit_tensor")
        self.inherit_tensor(names)

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

    Get one from :meth:`Client.model_open`; close it (or use it as a context manager) when done.
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
        request (``cairn_model_map``). Read-only, or with ``writable=True`` copy-on-write
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
                opts = _ffi.read_options(private_copy=int(bool(writable)))
                _check(self._conn.lib.cairn_model_map(r, count, _names_array([t[0] for t in infos]), ptrs, lens,
                                                      ctypes.byref(opts)))
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
        """Copies tensors into the caller's arrays with one request (``cairn_model_read``):
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
        self._read(_ffi.MEM_HOST, [(n, a.ctypes.data, a.nbytes) for n, a in items])

    def _read(self, kind: int, targets: Sequence[Tuple[str, int, int]]) -> None:
        if not targets:
            return
        count = len(targets)
        opts = _ffi.read_options(kind=kind)
        with self._op() as r:
            _check(self._conn.lib.cairn_model_read(r, count, _names_array([t[0] for t in targets]),
                                                   (ctypes.c_void_p * count)(*[t[1] for t in targets]),
                                                   (ctypes.c_size_t * count)(*[t[2] for t in targets]),
                                                   ctypes.byref(opts)))

    def read_device(self, targets: Sequence[Tuple[str, int, int]]) -> None:
        """Copies tensors into device memory with one request (``cairn_model_read`` with
        ``CAIRN_MEM_CUDA``):
        ``targets`` are ``(name, device address, nbytes)``, each exactly the tensor's size. With the
        daemon's HBM tier the copies are device-to-device, back to back; otherwise a library built
        with CUDA (:func:`library_has_cuda`) copies from the arena. Unavailable when neither can."""
        for name, _, nbytes in targets:
            if self.info(name)[3] != nbytes:
                raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                                    f"invalid argument: tensor {name!r} of model {self.id!r} has "
                                    f"{self.info(name)[3]} bytes, the device buffer {nbytes}")
        self._read(_ffi.MEM_CUDA, targets)

    def map_device(self, names: Optional[Iterable[str]] = None, device: int = -1) -> Dict[str, Tuple[int, int, Any]]:
        """Tensors (all non-empty ones, or ``names``) as zero-copy views of the daemon's copies in its
        HBM tier on ``device`` (-1: its first), leased with one request
        (``cairn_model_map`` with ``CAIRN_MEM_CUDA``, CUDA IPC): name -> ``(device address, nbytes, keeper)``.
        The leases last while any ``keeper`` is referenced (hold it as long as the memory is used).
        Unavailable when the daemon has no HBM tier."""
        infos = [t for t in self._select(names) if t[3]]
        count = len(infos)
        ptrs = (ctypes.c_void_p * count)()
        sizes = (ctypes.c_size_t * count)()
        with self._op() as r:
            lease = self._lease
            if count:
                opts = _ffi.read_options(kind=_ffi.MEM_CUDA, device=int(device))
                _check(self._conn.lib.cairn_model_map(r, count, _names_array([t[0] for t in infos]), ptrs, sizes,
                                                      ctypes.byref(opts)))
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
