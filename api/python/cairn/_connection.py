"""The connection under a cairn Client: the C client handle and its lock, the leases that keep
zero-copy arrays' bytes alive, tickets of commits, and device buffers to store."""
from __future__ import annotations

import collections
import contextlib
import ctypes
import threading
import weakref
from typing import Any, Deque, Iterator, Optional, Sequence, Set, Tuple

import numpy as np

from . import _dtypes, _errors
from ._errors import CairnError
from ._args import _SLICE_MS, _shutdown, _slices, _timeout_ms

# libcairn sends tensors up to this size inline in the request (api/cpp/connection.hpp, kInlineLimit).
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
    :meth:`Client.pipeline_flush`, or any later call of this client that needs a reply).
    Tickets belong to their client's connection: a ticket that is not waited for before the client
    closes is forgotten (the daemon still flushes the model; a pipelined commit's error then comes
    from :meth:`Client.pipeline_flush`).
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
                st = self._conn.lib.cairn_ticket_wait(self._handle, ms)
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
