"""The cairn client: a connection to the node's cairnd (libcairn's C API through ctypes)."""
from __future__ import annotations

import ctypes
import json
import os
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _dtypes, _errors, _ffi
from ._args import _check, _deprecated, _durability, _json, _name, _shape_arg, _slices, _timeout_ms
from ._connection import _INLINE_LIMIT, DeviceArray, Ticket, _Connection  # noqa: F401 (re-exported)
from ._models import ModelReader, ModelWriter, TensorInfo, _converted_in_arena, library_has_cuda  # noqa: F401

PathLike = Union[str, "os.PathLike[str]"]


# With a progress callback, save_model copies runs of tensors of at most this many bytes at a time.
_PROGRESS_BATCH = 64 << 20

class Client:
    """A connection to the node's cairnd. Create one with :func:`cairn.connect`.

    Method names follow the C API's (cairn.h): the C name without ``cairn_`` and without the object
    the class stands for -- ``cairn_tensor_put`` is :meth:`tensor_put`, ``cairn_model_open``
    :meth:`model_open`, ``cairn_pipeline_flush`` :meth:`pipeline_flush`; a :class:`ModelWriter`
    has ``add_tensor``, ``commit``, a :class:`ModelReader` ``read``, ``map``. :meth:`save_model`,
    :meth:`load_model`, :meth:`put_tensor` and :meth:`get_tensor` are the whole-model and
    named-tensor calls the design fixes. Older names warn (DeprecationWarning) for one release
    (docs/api.md).

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

    def tensor_put(self, key: str, array: Any, dtype: _dtypes.DTypeLike = None) -> None:
        """Stores (or replaces) ``array`` under ``key`` (a named tensor, kept in the daemon's DRAM
        until deleted or replaced; not a model). ``dtype``: a cairn dtype name to store raw bits as
        (``"BF16"`` for uint16 bits, ``"F8_E4M3"``/``"F8_E5M2"`` for uint8 bits)."""
        k = _name(key, "key")
        a, dt = _dtypes.prepare(array, dtype, f"tensor {key!r}")
        with self._conn.op() as h:
            _check(self._lib.cairn_tensor_put(h, k, a.ctypes.data, _dtypes.code(dt), a.ndim, _shape_arg(a.shape)))

    def put_tensor(self, key: str, array: Any, dtype: _dtypes.DTypeLike = None) -> None:
        """:meth:`tensor_put` under the name the design fixes."""
        self.tensor_put(key, array, dtype)

    def tensor_info(self, key: str) -> Tuple[str, Tuple[int, ...], int]:
        """(cairn dtype name, shape, nbytes) of the named tensor ``key``."""
        k = _name(key, "key")
        with self._conn.op() as h:
            return self._info(h, k)

    def _info(self, h: ctypes.c_void_p, k: bytes) -> Tuple[str, Tuple[int, ...], int]:
        dt, nd, n = ctypes.c_int(), ctypes.c_int(), ctypes.c_size_t()
        shape = (ctypes.c_int64 * _ffi.MAX_DIMS)()
        _check(self._lib.cairn_tensor_info(h, k, ctypes.byref(dt), ctypes.byref(nd), shape, ctypes.byref(n)))
        return _dtypes.name_of_code(dt.value), tuple(shape[: nd.value]), n.value

    def tensor_get(self, key: str) -> np.ndarray:
        """A copy of the named tensor ``key`` as a new, writable array (``cairn_tensor_unpack_alloc``:
        one round trip; BF16 and FP8 come back as raw uint16/uint8 bits, see :data:`cairn.RAW_DTYPES`)."""
        k = _name(key, "key")
        got: List[np.ndarray] = []

        def alloc(_ctx: Any, dtype: int, ndim: int, shape: Any, nbytes: int) -> int:
            # Called by cairn_tensor_unpack_alloc with the tensor's description: one round trip.
            try:
                a = np.empty(tuple(shape[i] for i in range(ndim)), _dtypes.numpy_dtype(_dtypes.name_of_code(dtype)))
            except Exception:  # an unknown dtype: no buffer (CAIRN_ERR_NO_SPACE) rather than a crash
                return 0
            if a.nbytes != nbytes:
                return 0
            got.append(a)
            return a.ctypes.data or 1  # not NULL, also for an empty tensor
        with self._conn.op() as h:
            _check(self._lib.cairn_tensor_unpack_alloc(h, k, _ffi.ALLOC_FN(alloc), None))
        return got[0]

    def get_tensor(self, key: str) -> np.ndarray:
        """:meth:`tensor_get` under the name the design fixes."""
        return self.tensor_get(key)

    def tensor_poll(self, key: str, timeout: Optional[float] = 0.0) -> bool:
        """Waits up to ``timeout`` seconds (0: do not wait, None: forever) for ``key`` to exist; returns
        whether it does."""
        k = _name(key, "key")
        found = ctypes.c_int()
        for ms in _slices(_timeout_ms(timeout)):
            with self._conn.op() as h:
                _check(self._lib.cairn_tensor_poll(h, k, ms, ctypes.byref(found)))
            if found.value:
                break
        return bool(found.value)

    def tensor_delete(self, key: str) -> None:
        """Deletes the named tensor ``key`` (NotFound if there is none)."""
        k = _name(key, "key")
        with self._conn.op() as h:
            _check(self._lib.cairn_tensor_delete(h, k))

    def poll_tensor(self, key: str, timeout: Optional[float] = 0.0) -> bool:
        """Deprecated: :meth:`tensor_poll`."""
        _deprecated("Client.poll_tensor", "Client.tensor_poll")
        return self.tensor_poll(key, timeout)

    def delete_tensor(self, key: str) -> None:
        """Deprecated: :meth:`tensor_delete`."""
        _deprecated("Client.delete_tensor", "Client.tensor_delete")
        self.tensor_delete(key)

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
        on_bytes: Optional[Callable[[int], None]] = None,
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
            on_bytes: called with the bytes of each batch of tensors once it is in the arena
                (batches of at most 64 MiB when it is given), for a progress bar.

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
            prepared.append((name, a, dt, _converted_in_arena(a)))  # add_many makes the others contiguous where needed
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
        with self.model_create(id, parent, part=part, part_timeout=part_timeout, copy_threads=copy_threads) as w:
            # The arena space of every big tensor in one round trip.
            big = [p[1].nbytes for _, p in steps if p is not None and p[1].nbytes > _INLINE_LIMIT]
            if len(big) > 1:
                w.reserve(big)
            # Runs of tensors copied from the caller's arrays go in one call each: the library
            # copies (and hashes) all of a run's tensors on every core, not one at a time.
            run: Dict[str, np.ndarray] = {}
            run_dtypes: Dict[str, str] = {}
            run_bytes = 0

            def add_run() -> None:
                nonlocal run_bytes
                if run:
                    w.add_tensors(run, run_dtypes)
                    run.clear()
                    run_dtypes.clear()
                    if on_bytes is not None:
                        on_bytes(run_bytes)
                run_bytes = 0

            for name, step in steps:
                if step is None:
                    add_run()
                    w.inherit_tensor(name)
                elif not step[3]:
                    run[name], run_dtypes[name] = step[1], step[2]
                    run_bytes += step[1].nbytes
                    if on_bytes is not None and run_bytes >= _PROGRESS_BATCH:
                        add_run()
                else:
                    # Device-to-host, or converted once, straight into arena space.
                    add_run()
                    w.add_tensor(name, step[1], step[2])
                    if on_bytes is not None:
                        on_bytes(step[1].nbytes)
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

    def model_create(self, id: str, parent: Optional[str] = None, *, part: Optional[Tuple[int, int]] = None,
                     part_timeout: Optional[float] = None, copy_threads: int = 0) -> "ModelWriter":
        """Starts model ``id`` (derived from ``parent``; ``cairn_model_create``, or
        ``cairn_model_create_part`` with ``part``) and returns its :class:`ModelWriter`: add
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

    def writer(self, id: str, parent: Optional[str] = None, *, part: Optional[Tuple[int, int]] = None,
               part_timeout: Optional[float] = None, copy_threads: int = 0) -> "ModelWriter":
        """Deprecated: :meth:`model_create`."""
        _deprecated("Client.writer", "Client.model_create")
        return self.model_create(id, parent, part=part, part_timeout=part_timeout, copy_threads=copy_threads)

    def pipeline_flush(self) -> None:
        """Collects the replies of every pipelined commit (``save_model`` at ``"memory"`` without
        ``wait``) still in flight, resolving their tickets; afterwards every commit of this client is
        visible to every client. Raises the first error of a pipelined commit whose ticket was
        garbage collected unwaited (errors of tickets still held are raised by their ``wait()``), or
        Unavailable when the connection was lost."""
        with self._conn.op() as h:
            _check(self._lib.cairn_pipeline_flush(h))

    @property
    def pipeline_in_flight(self) -> int:
        """Requests sent and not yet answered (pipelined commits)."""
        with self._conn.op() as h:
            return int(self._lib.cairn_pipeline_in_flight(h))

    def flush_pipeline(self) -> None:
        """Deprecated: :meth:`pipeline_flush`."""
        _deprecated("Client.flush_pipeline", "Client.pipeline_flush")
        self.pipeline_flush()

    @property
    def in_flight(self) -> int:
        """Deprecated: :attr:`pipeline_in_flight`."""
        _deprecated("Client.in_flight", "Client.pipeline_in_flight")
        return self.pipeline_in_flight

    def model_open(self, id: str) -> ModelReader:
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

    def open_model(self, id: str) -> ModelReader:
        """Deprecated: :meth:`model_open`."""
        _deprecated("Client.open_model", "Client.model_open")
        return self.model_open(id)

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
        with self.model_open(id) as r:
            return r.read(names) if copy else r.map(names, writable=writable)

    def read_into(self, id: str, arrays: Mapping[str, np.ndarray]) -> None:
        """Copies tensors of model ``id`` into the caller's arrays with one request
        (``cairn_model_read``): ``arrays`` maps tensor names to writable, C-contiguous
        arrays of exactly the tensor's size in bytes (any dtype). One copy, straight into that memory."""
        with self.model_open(id) as r:
            r.read_into(arrays)

    def model_put_file(self, id: str, path: PathLike, parent: Optional[str] = None, durability: str = "global",
                       meta: Optional[Mapping[str, Any]] = None) -> None:
        """Stores the safetensors file ``path`` as model ``id`` (``cairn_model_put_file``: the file's
        tensors straight into the daemon's arena, its header kept so :meth:`model_get_file` gives the
        same bytes back), derived from ``parent``; returns once ``durability`` is reached. A file that
        is not valid safetensors is InvalidArgument naming what is wrong."""
        mid = _name(id, "model id")
        par = _name(parent, "parent id") if parent is not None else None
        level = _durability(durability)
        meta_json = _json(dict(meta), "meta") if meta is not None else None
        with self._conn.op() as h:
            _check(self._lib.cairn_model_put_file(h, mid, os.fsencode(path), par, level, meta_json))

    def model_get_file(self, id: str, path: PathLike) -> None:
        """Writes model ``id`` as the safetensors file ``path`` (``cairn_model_get_file``: straight
        from the daemon's arena into a temporary file renamed into place)."""
        mid = _name(id, "model id")
        with self._conn.op() as h:
            _check(self._lib.cairn_model_get_file(h, mid, os.fsencode(path)))

    def model_prefetch(self, id: str, *, all: bool = False, device: Optional[int] = None,
                       timeout: Optional[float] = None) -> Dict[str, Any]:
        """Stages model ``id`` ahead of need (``cairn_model_prefetch``) and returns the daemon's
        answer: into this node's DRAM (``{"bytes"}``), or with ``device`` (an HBM device, -1: the
        daemon's first) into its HBM tier. ``all=True``: into every member of the job's peer group
        at once (docs/peers.md), waiting until all have it (``timeout`` seconds, default the
        daemon's 600); the answer is ``{"bytes", "seconds", "all_seconds", "all_ok", "members":
        [{"member", "ok", "bytes", "seconds", "error"}]}`` (a member that failed is listed, not
        raised)."""
        mid = _name(id, "model id")
        opts = _ffi.prefetch_options(all=int(bool(all)))
        if device is not None:
            opts.kind = _ffi.MEM_CUDA
            opts.device = int(device)
        if timeout is not None:
            opts.timeout_ms = max(1, int(timeout * 1000))
        out = ctypes.c_void_p()
        with self._conn.op() as h:
            _check(self._lib.cairn_model_prefetch(h, mid, ctypes.byref(opts), ctypes.byref(out)))
            try:
                text = ctypes.string_at(out.value) if out.value else b"{}"
            finally:
                self._lib.cairn_free(out)
        return json.loads(text)

    def put_file(self, id: str, path: PathLike, parent: Optional[str] = None, durability: str = "global",
                 meta: Optional[Mapping[str, Any]] = None) -> None:
        """Deprecated: :meth:`model_put_file`."""
        _deprecated("Client.put_file", "Client.model_put_file")
        self.model_put_file(id, path, parent, durability, meta)

    def get_file(self, id: str, path: PathLike) -> None:
        """Deprecated: :meth:`model_get_file`."""
        _deprecated("Client.get_file", "Client.model_get_file")
        self.model_get_file(id, path)

    def prefetch(self, id: str, all: bool = False) -> Optional[Dict[str, Any]]:
        """Deprecated: :meth:`model_prefetch` (which returns the answer also without ``all``)."""
        _deprecated("Client.prefetch", "Client.model_prefetch")
        answer = self.model_prefetch(id, all=all)
        return answer if all else None

    # ---- catalog and queries ----

    def _json_call(self, function: str, payload: bytes) -> Dict[str, Any]:
        """Calls a C function taking (client, JSON text, char **result) and returns the parsed
        result, freeing it (cairn_request, cairn_query, cairn_hint). A failure raises its CairnError."""
        out = ctypes.c_void_p()
        with self._conn.op() as h:
            _check(getattr(self._lib, function)(h, payload, ctypes.byref(out)))
            try:
                text = ctypes.string_at(out.value) if out.value else b"{}"
            finally:
                self._lib.cairn_free(out)
        return json.loads(text)

    def _request(self, request: Dict[str, Any]) -> Dict[str, Any]:
        """Sends one request that has no call of its own (``cairn_request``: list, show, stats, ...);
        returns the response's fields (without ``status``). A failed response raises its CairnError."""
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
        ``"population"`` (optional ``scores=[one per model, higher is better]`` with
        ``tournament=k``, the tournament size parents are drawn with), ``"sequence"``
        (``ahead=k``) or ``"done"``. Returns the daemon's answer
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
