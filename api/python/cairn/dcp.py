"""torch.distributed.checkpoint (DCP) storage on cairn: ``dcp.save`` / ``dcp.async_save`` /
``dcp.load`` with every rank writing its shards straight into its node's daemon.

``import cairn.dcp`` (needs torch; the rest of ``cairn`` does not)::

    import torch.distributed.checkpoint as dcp
    from cairn.dcp import CairnWriter, CairnReader

    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    dcp.save(state, storage_writer=CairnWriter("run7-step100", durability="memory"))
    dcp.save(state, storage_writer=CairnWriter("run7-step200", parent="run7-step100"))
    dcp.load(state, storage_reader=CairnReader("run7-step200"))       # in place, any rank count

What a checkpoint is: one cairn model of N + 1 parts for N ranks. Rank ``i`` commits part ``i``
(its shards, one tensor per DCP write item, copied once into the daemon's arena); the coordinator
commits part N, DCP's ``Metadata`` (pickled, the tensor ``__dcp_metadata__``), in ``finish``. The
model becomes visible only when all N + 1 parts are in, so a checkpoint is there whole or not at
all: a rank that dies mid-save, or a save that fails anywhere, leaves nothing (its parts are
dropped ``part_timeout`` seconds after the first arrived). Model metadata says
``{"format": "torch.distributed.checkpoint", "ranks": N}``.

A checkpoint saved with ``parent=`` records its lineage, and like every cairn model stores only
the 16 MiB chunks that differ from every chunk already stored: a fine-tuning run that changes 1% of
its parameters between checkpoints stores about 1% more each time.

Reading maps the stored shards (zero-copy views of the daemon's arena) and copies each read item
once into the tensor the planner gives (a whole, contiguous destination is filled straight by
the library, on the CPU or a CUDA device). With :class:`ZeroCopyLoadPlanner` the state dict's
tensors become copy-on-write views of the arena instead: no copy at all. Loading on a different
number of ranks than saved (resharding) works as DCP's filesystem backend does: each read item
names the stored shard and the slice of it that it needs.

``dcp.async_save`` uses a :class:`CairnWriter` as its stager (``AsyncStager``): the staged state dict
lives in arena space of this rank's part, so the training step blocks for one copy into the arena
and the commit needs no further copy (see :meth:`CairnWriter.stage`).

See docs/python.md, "torch.distributed.checkpoint".
"""
from __future__ import annotations

import dataclasses
import gc
import io
import os
import pickle
import threading
import uuid
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex
from torch.distributed.checkpoint.planner import (LoadItemType, LoadPlan, LoadPlanner, ReadItem, SavePlan, SavePlanner,
                                                  WriteItem, WriteItemType)
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from . import _errors
from . import _torch_dtypes as _td
from .client import Client, DeviceArray, ModelReader, ModelWriter, Ticket, connect
from ._args import _name
from ._dcp_staging import _collect, _in_arena, _rebuild

try:  # torch >= 2.4
    from torch.distributed.checkpoint.metadata import StorageMeta
except ImportError:  # pragma: no cover - older torch
    StorageMeta = None  # type: ignore[assignment,misc]

__all__ = ["CairnWriter", "CairnReader", "ZeroCopyLoadPlanner", "METADATA_TENSOR", "FORMAT"]

#: The tensor (U8, a pickled ``torch.distributed.checkpoint.metadata.Metadata``) the coordinator's
#: part holds.
METADATA_TENSOR = "__dcp_metadata__"
#: The ``format`` field of a checkpoint's model metadata.
FORMAT = "torch.distributed.checkpoint"
# Host tensors are handed to the library in batches of about this many bytes (one multi-threaded
# copy-and-hash call each), so that lazily resolved items are not all held at once.
_BATCH_BYTES = 256 << 20


_clients: Dict[str, Client] = {}
_clients_lock = threading.Lock()


def _shared_client(socket: Optional[Union[str, "os.PathLike[str]"]]) -> Client:
    """The process's client for ``socket`` (None: cairn.torch's default client, on $CAIRN_SOCKET or
    the default socket), connected on first use and shared by every writer and reader: one
    connection whose mapping of the daemon's arena is set up once, not once per checkpoint."""
    if socket is None:
        from .torch import default_client
        return default_client()
    key = os.fspath(socket)
    with _clients_lock:
        c = _clients.get(key)
        if c is None or c.closed:
            c = _clients[key] = connect(key)
        return c


def _checkpoint_id(value: Any, what: str) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value:
        raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                            f"invalid argument: {what}: a cairn checkpoint id is a model id (a non-empty str), "
                            f"not {value!r}")
    _name(value, "checkpoint id")
    return value


def _in_checkpoint(e: _errors.CairnError, checkpoint_id: str, doing: str) -> _errors.CairnError:
    """``e`` with the checkpoint and what was being done named (unless its message names it already)."""
    if repr(checkpoint_id) in e.message:
        return e
    return _errors.make_error(e.code, f"{e.message} (checkpoint {checkpoint_id!r}, {doing})") if e.code >= 0 else \
        _errors.error(e.status, f"{e.message} (checkpoint {checkpoint_id!r}, {doing})")


def _storage_key(item: WriteItem) -> str:
    """The tensor name a write item is stored under: its fully qualified name, plus the chunk's
    offsets for a shard of a bigger tensor (``"layer.weight@512_0"``). DCP writes each index once,
    so the names are unique across ranks; they are the same from one checkpoint to the next."""
    fqn = item.index.fqn
    if item.type != WriteItemType.BYTE_IO and item.tensor_data is not None:
        chunk = item.tensor_data.chunk
        if list(chunk.sizes) != list(item.tensor_data.size) or any(int(o) for o in chunk.offsets):
            return f"{fqn}@{'_'.join(str(int(o)) for o in chunk.offsets)}"
    return fqn


def _narrow(t: torch.Tensor, offsets: Sequence[int], lengths: Sequence[int]) -> torch.Tensor:
    for dim, (o, n) in enumerate(zip(offsets, lengths)):
        if o != 0 or n != t.size(dim):
            t = t.narrow(dim, int(o), int(n))
    return t


@dataclasses.dataclass(frozen=True)
class _PartPlan:
    """SavePlan.storage_data: which part of the checkpoint's model a rank's plan commits."""
    index: int
    count: int


class _Staged:
    """The arena space one :meth:`CairnWriter.stage` filled: the open part writer and, by address,
    the staged tensors' names there."""

    def __init__(self, writer: ModelWriter, index: int, count: int) -> None:
        self.writer = writer
        self.index = index
        self.count = count
        self.names: Dict[int, Tuple[str, int, torch.dtype]] = {}  # data_ptr -> (name, nbytes, dtype)

    def name_of(self, t: torch.Tensor) -> Optional[str]:
        """The staged tensor's name when ``t`` is exactly one (its whole, contiguous bytes)."""
        got = self.names.get(t.data_ptr()) if t.device.type == "cpu" else None
        if got is None:
            return None
        name, nbytes, dtype = got
        if t.dtype != dtype or not t.is_contiguous() or t.numel() * t.element_size() != nbytes:
            return None
        return name


class _OnCairn:
    """What the writer and the reader share: the checkpoint id (a model id) and the client they go
    through (the process's connection to the socket, made on first use)."""

    _id: str
    _client: Optional[Client]
    _socket: Optional[Union[str, "os.PathLike[str]"]]

    @property
    def checkpoint_id(self) -> str:
        """The model id the next save writes, or the next load reads."""
        return self._id

    @property
    def client(self) -> Client:
        """The client this storage goes through (connected on first use)."""
        if self._client is None or self._client.closed:
            self._client = _shared_client(self._socket)
        return self._client

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Union[str, "os.PathLike[str]"]) -> bool:
        """Whether ``checkpoint_id`` can be a cairn checkpoint id (a valid model id)."""
        try:
            _checkpoint_id(checkpoint_id, "checkpoint_id")
            return True
        except _errors.CairnError:
            return False


class CairnWriter(_OnCairn, StorageWriter, AsyncStager):
    """A ``torch.distributed.checkpoint`` StorageWriter that stores checkpoint ``checkpoint_id`` as
    one multi-part cairn model (see the module's description), and the ``AsyncStager`` that
    ``dcp.async_save`` uses with it.

    Args:
        checkpoint_id: the checkpoint's model id (ids are immutable: saving to an existing id fails
            with AlreadyExists). ``dcp.save(checkpoint_id=...)`` replaces it.
        parent: the checkpoint it derives from (its lineage; must exist).
        durability: what ``dcp.save`` waits for before it returns on every rank: ``"memory"`` (the
            checkpoint is visible, its bytes in the node daemons' DRAM), ``"local"`` or
            ``"global"`` (in the repository; the default).
        client: a :class:`cairn.Client` to use; else the process's client for ``socket`` (else
            ``$CAIRN_SOCKET``, else the default socket), connected on first use and shared by
            every CairnWriter and CairnReader of the process.
        part_timeout: seconds after a rank's part arrives within which every other part must
            arrive, or the whole checkpoint is dropped (a rank died). Default 600.
        meta: more model metadata (a JSON object), merged with ``{"format", "ranks"}``.
        process_group: the group ``dcp.async_save`` runs on, when not the default one (staging
            happens before DCP's planning, so the stager asks the group for its rank and size).

    Not for two saves at once; one writer may serve one save after another (a new
    ``checkpoint_id`` each time).
    """

    _synchronize_after_execute: bool = False  # stage() is complete when it returns

    def __init__(self, checkpoint_id: Union[str, "os.PathLike[str]"], parent: Optional[str] = None,
                 durability: str = "global", *, client: Optional[Client] = None,
                 socket: Optional[Union[str, "os.PathLike[str]"]] = None, part_timeout: float = 600.0,
                 meta: Optional[Mapping[str, Any]] = None, process_group: Optional[Any] = None) -> None:
        super().__init__()
        self._id = _checkpoint_id(checkpoint_id, "CairnWriter")
        self.parent = None if parent is None else _checkpoint_id(parent, "CairnWriter parent")
        if durability not in ("memory", "local", "global"):
            raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                                f"invalid argument: durability {durability!r} is not one of 'memory', 'local', 'global'")
        self.durability = durability
        self.part_timeout = float(part_timeout)
        self.meta = dict(meta or {})
        self.process_group = process_group
        self._client = client
        self._socket = socket
        self._is_coordinator = False
        self._rank: Optional[int] = None
        self._save_id = uuid.uuid4().hex
        self._tickets: List[Ticket] = []
        self._staged: Optional[_Staged] = None

    # ---- StorageWriter ----

    def reset(self, checkpoint_id: Optional[Union[str, "os.PathLike[str]"]] = None, **kwargs: Any) -> None:
        """A new save is starting (to ``checkpoint_id`` when given)."""
        if checkpoint_id:
            new_id = _checkpoint_id(checkpoint_id, "checkpoint_id")
            if self._staged is not None and new_id != self._id:
                staged_id = self._id
                self._drop_staged()
                raise _errors.error(
                    "CAIRN_ERR_INVALID_ARGUMENT",
                    f"invalid argument: checkpoint {staged_id!r} was staged by async_save, which was then given "
                    f"checkpoint_id={new_id!r}; pass the id to CairnWriter, not to async_save (nothing was saved)")
            self._id = new_id
        self._save_id = uuid.uuid4().hex

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self._is_coordinator = is_coordinator
        self._rank = kwargs.get("rank")
        self._tickets = []
        if kwargs.get("use_collectives", True) is False:
            self._drop_staged()
            raise _errors.error(
                "CAIRN_ERR_INVALID_ARGUMENT",
                f"invalid argument: checkpoint {self._id!r}: a cairn checkpoint is one model whose parts the "
                "coordinator completes, so dcp.save(use_collectives=False) is not supported")

    def storage_meta(self) -> Optional[Any]:
        if StorageMeta is None:
            return None
        return StorageMeta(checkpoint_id=self._id, save_id=self._save_id)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: List[SavePlan]) -> List[SavePlan]:
        # N ranks write parts 0..N-1; the coordinator's finish writes part N, the metadata.
        n = len(plans)
        return [dataclasses.replace(p, storage_data=_PartPlan(i, n + 1)) for i, p in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        """Writes this rank's items as its part of the checkpoint's model: every tensor copied once
        into the daemon's arena (a CUDA tensor device-to-host straight there; a tensor staged by
        :meth:`stage` is there already), then the part committed without waiting for the daemon."""
        part = plan.storage_data
        if not isinstance(part, _PartPlan):
            raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                                f"invalid argument: checkpoint {self._id!r}: the save plan was not prepared by "
                                "CairnWriter.prepare_global_plan")
        staged, self._staged = self._staged, None
        if staged is not None and (staged.index, staged.count) != (part.index, part.count):
            # Staged for another rank or group than DCP's: the staged tensors are copied like any.
            warnings.warn(f"cairn.dcp: checkpoint {self._id!r} was staged as part {staged.index} of "
                          f"{staged.count} but DCP planned part {part.index} of {part.count} (pass "
                          "process_group= to CairnWriter); copying the staged tensors once more", RuntimeWarning)
            unused, staged = staged, None
        else:
            unused = None
        try:
            w = staged.writer if staged is not None else self.client.model_create(
                self._id, self.parent, part=(part.index, part.count), part_timeout=self.part_timeout)
            try:
                results = self._write_items(w, plan, planner, staged)
                self._tickets.append(w.commit(self.durability, pipelined=True))
            except BaseException:
                w.abort()
                raise
        except _errors.CairnError as e:
            raise _in_checkpoint(e, self._id, f"writing part {part.index} of {part.count}") from None
        finally:
            if unused is not None:
                unused.writer.abort()
        fut: Future = Future()
        fut.set_result(results)
        return fut

    def _write_items(self, w: ModelWriter, plan: SavePlan, planner: SavePlanner,
                     staged: Optional[_Staged]) -> List[WriteResult]:
        results: List[WriteResult] = []
        batch: Dict[str, np.ndarray] = {}
        batch_dtypes: Dict[str, str] = {}
        held: List[Any] = []  # keeps the batch's sources alive until it is added
        pending = 0

        def flush() -> None:
            nonlocal pending
            if batch:
                w.add_tensors(batch, batch_dtypes)
            batch.clear()
            batch_dtypes.clear()
            held.clear()
            pending = 0

        for item in plan.items:
            data = planner.resolve_data(item)  # lazily, one item at a time
            if item.type == WriteItemType.BYTE_IO:
                key = _storage_key(item)
                raw = data.getvalue() if isinstance(data, io.BytesIO) else bytes(data.read())
                batch[key], batch_dtypes[key] = np.frombuffer(raw, np.uint8), "U8"
                held.append(raw)
                pending += len(raw)
                results.append(WriteResult(index=item.index, size_in_bytes=len(raw), storage_data=key))
            else:
                t = data.detach() if isinstance(data, torch.Tensor) else data
                if not isinstance(t, torch.Tensor):
                    raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                                        f"invalid argument: write item {item.index.fqn!r} resolved to a "
                                        f"{type(data).__name__}, not a tensor")
                nbytes = t.numel() * t.element_size()
                key = staged.name_of(t) if staged is not None else None
                if key is None:
                    key = _storage_key(item)
                    if t.device.type == "cuda" and _td.cairn_dtype(t.dtype) is not None:
                        flush()
                        self._add_device(w, key, t)
                    else:
                        arr, cname = _td.to_numpy(key, t)
                        if arr.flags.c_contiguous:
                            batch[key], batch_dtypes[key] = arr, cname
                            held.append(t)
                            pending += nbytes
                        else:
                            w.add_tensor(key, arr, cname)  # converted once, straight into arena space
                results.append(WriteResult(index=item.index, size_in_bytes=nbytes, storage_data=key))
            if pending >= _BATCH_BYTES:
                flush()
        flush()
        if staged is not None:
            # Hashed now, on the library's threads: behind the training, not during the staging copy.
            for name, _, _ in staged.names.values():
                w.seal_tensor(name)
        return results

    @staticmethod
    def _add_device(w: ModelWriter, key: str, t: torch.Tensor) -> None:
        """A CUDA tensor copied device-to-host straight into arena space (through host memory when
        this libcairn has no CUDA)."""
        src = t.resolve_conj().resolve_neg().contiguous()
        cname = _td.cairn_dtype(src.dtype)
        torch.cuda.current_stream(src.device).synchronize()  # the library's copy runs outside torch's streams
        try:
            w.add_tensor(key, DeviceArray(src.data_ptr(), tuple(src.shape), cname, owner=src))
        except _errors.Unavailable:
            arr, cname = _td.to_numpy(key, src)
            w.add_tensor(key, arr, cname)

    def finish(self, metadata: Metadata, results: List[List[WriteResult]]) -> None:
        """On the coordinator: commits the last part (DCP's metadata, with where each item is
        stored) and waits until the whole checkpoint is visible and at its durability. Raises --
        and nothing is visible -- when a rank's part is missing or failed."""
        storage: Dict[MetadataIndex, Any] = {}
        for rank_results in results:
            for r in rank_results:
                storage[r.index] = r.storage_data
        metadata.storage_data = storage
        if hasattr(metadata, "storage_meta"):
            metadata.storage_meta = self.storage_meta()
        blob = pickle.dumps(metadata, protocol=pickle.HIGHEST_PROTOCOL)
        n = len(results)
        try:
            with self.client.model_create(self._id, self.parent, part=(n, n + 1), part_timeout=self.part_timeout) as w:
                w.add_tensor(METADATA_TENSOR, np.frombuffer(blob, np.uint8))
                w.set_metadata({**self.meta, "format": FORMAT, "ranks": n, "torch": torch.__version__})
                ticket = w.commit(self.durability)
            ticket.wait()
        except _errors.CairnError as e:
            raise _in_checkpoint(e, self._id, "committing its metadata") from None

    def wait(self, timeout: Optional[float] = None) -> None:
        """Waits for this rank's part of the last save to reach the durability; raises what failed
        the checkpoint (e.g. another rank's part missing after ``part_timeout``). ``dcp.save`` has
        waited already on the coordinator; this is for the other ranks, or a save that raised."""
        for t in self._tickets:
            t.wait(timeout)

    # ---- AsyncStager ----

    def stage(self, state_dict: Dict[str, Any]) -> Dict[str, Any]:
        """Copies ``state_dict`` into arena space of this rank's part of checkpoint
        ``checkpoint_id`` and returns the same structure over that space (what ``dcp.async_save``
        then saves in the background, adding no copy). Tensors over 64 KiB are staged there (a CUDA
        tensor copied device-to-host into it); smaller ones, and objects, are copied privately.
        Returns once every copy is done: the training may change the originals from then on.

        A replicated tensor is staged by every rank (DCP decides after staging which rank's copy
        the metadata points at); the copies are stored once, by content. Sharded tensors (DTensor,
        ShardedTensor) are staged as their local shards."""
        if self._staged is not None:
            # Its save has not reached write_data: dropping the staged space now could hand memory
            # that save is about to read to another checkpoint.
            raise _errors.error(
                "CAIRN_ERR_INVALID_ARGUMENT",
                f"invalid argument: checkpoint {self._id!r} was staged by an earlier async_save that has not written "
                "it yet; wait for that save's future (and call close() if it failed) before staging again, or use "
                "one CairnWriter per checkpoint")
        group = self.process_group
        if dist.is_available() and dist.is_initialized():
            rank, size = dist.get_rank(group), dist.get_world_size(group)
        else:
            rank, size = 0, 1
        try:
            w = self.client.model_create(self._id, self.parent, part=(rank, size + 1), part_timeout=self.part_timeout)
        except _errors.CairnError as e:
            raise _in_checkpoint(e, self._id, "staging it") from None
        staged = _Staged(w, rank, size + 1)
        try:
            tensors: List[Tuple[str, torch.Tensor]] = []
            skeleton = _collect(state_dict, "", tensors)
            big = [(p, t) for p, t in tensors if _in_arena(t)]
            w.reserve([t.numel() * t.element_size() for _, t in big])
            staged_by_path: Dict[str, torch.Tensor] = {}
            for path, t in big:
                name = f"{path}@rank{rank}"
                cname = _td.cairn_dtype(t.dtype)
                arr = w.add_tensor_space(name, cname, tuple(t.shape))
                dst = _td.from_numpy(name, arr, cname)
                dst.copy_(t.detach())
                staged.names[dst.data_ptr()] = (name, dst.numel() * dst.element_size(), dst.dtype)
                staged_by_path[path] = dst
            if any(t.device.type == "cuda" for _, t in big):
                torch.cuda.synchronize()
            out = _rebuild(skeleton, staged_by_path)
        except _errors.CairnError as e:
            w.abort()
            raise _in_checkpoint(e, self._id, f"staging part {rank} of {size + 1}") from None
        except BaseException:
            w.abort()
            raise
        self._staged = staged
        return out

    def synchronize_staging(self) -> None:
        """Nothing to wait for: :meth:`stage` returns once the copy is done."""

    def close(self) -> None:
        """Drops a staged checkpoint that was never written (its async_save failed before writing it),
        freeing its arena space. Only once that save is over: its state dict is that space."""
        self._drop_staged()

    def _drop_staged(self) -> None:
        staged, self._staged = self._staged, None
        if staged is not None:
            staged.writer.abort()

    def __getstate__(self) -> Dict[str, Any]:
        # For a background process (async_save's PROCESS executor): it connects on its own, and
        # what was staged here stays here (that save copies from the state dict it is sent).
        state = dict(self.__dict__)
        state["_client"] = None
        state["_staged"] = None
        state["_tickets"] = []
        return state


# ---- reading ----

class ZeroCopyLoadPlanner(DefaultLoadPlanner):
    """A DefaultLoadPlanner that lets :class:`CairnReader` hand over the stored tensors themselves:
    each state-dict tensor that a read item covers whole (same shape and dtype, on the CPU, not a
    DTensor or ShardedTensor) is *replaced* by a writable copy-on-write view of the daemon's arena
    -- loading copies nothing, and a later write (an optimizer step) copies only the pages it
    touches, never changing the checkpoint. The views keep the checkpoint's tensors pinned in the
    daemon's memory while they live. Other items (resharded slices, other devices) are copied
    into the state dict's tensors as usual. Put the loaded tensors into a module with
    ``module.load_state_dict(sd, assign=True)`` (no copy either) or plain ``load_state_dict`` (a copy)."""

    def adopt_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> bool:
        """Replaces the destination of ``read_item`` with ``tensor`` when the planner allows it (see
        the class); returns whether it did."""
        fqn = read_item.dest_index.fqn
        dst = self.state_dict.get(fqn)
        if type(dst) is not torch.Tensor and not isinstance(dst, torch.nn.Parameter):
            return False
        if dst.device.type != "cpu" or dst.dtype != tensor.dtype or tuple(dst.shape) != tuple(tensor.shape):
            return False
        if read_item.dest_offsets is not None and any(int(o) for o in read_item.dest_offsets):
            return False
        if self.flatten_state_dict and fqn in self.mappings:
            from torch.distributed.checkpoint._traverse import set_element
            set_element(self.original_state_dict, self.mappings[fqn], tensor)
        else:
            self.original_state_dict[fqn] = tensor
        self.state_dict[fqn] = tensor
        return True


class CairnReader(_OnCairn, StorageReader):
    """A ``torch.distributed.checkpoint`` StorageReader for checkpoint ``checkpoint_id`` (written by
    :class:`CairnWriter`), on any number of ranks.

    Args:
        checkpoint_id: the checkpoint's model id (``dcp.load(checkpoint_id=...)`` replaces it).
        client / socket: as for :class:`CairnWriter`.

    A missing checkpoint raises :class:`cairn.NotFound`, a model that is not a complete DCP
    checkpoint (no readable metadata, a tensor its metadata lists missing) :class:`cairn.CorruptData`;
    every error names the checkpoint.
    """

    def __init__(self, checkpoint_id: Union[str, "os.PathLike[str]"], *, client: Optional[Client] = None,
                 socket: Optional[Union[str, "os.PathLike[str]"]] = None) -> None:
        super().__init__()
        self._id = _checkpoint_id(checkpoint_id, "CairnReader")
        self._client = client
        self._socket = socket
        self._storage: Dict[MetadataIndex, str] = {}
        self._tensor_names: Optional[set] = None  # the checkpoint's tensors, learnt with its metadata
        self._load_id = uuid.uuid4().hex

    def reset(self, checkpoint_id: Optional[Union[str, "os.PathLike[str]"]] = None, **kwargs: Any) -> None:
        self._storage = {}
        self._tensor_names = None
        if checkpoint_id:
            self._id = _checkpoint_id(checkpoint_id, "checkpoint_id")
        self._load_id = uuid.uuid4().hex

    def _open(self) -> ModelReader:
        try:
            return self.client.model_open(self._id)
        except _errors.NotFound:
            raise _errors.error("CAIRN_ERR_NOT_FOUND",
                                f"not found: checkpoint {self._id!r} does not exist (no model of that id on the "
                                f"daemon at {self.client.address}; see `cairn ls`)") from None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """DCP's metadata of the checkpoint (its coordinator's part)."""
        if kwargs.get("rank") is not None:
            raise _errors.error("CAIRN_ERR_NOT_FOUND",
                                f"not found: checkpoint {self._id!r} has no per-rank metadata (a cairn checkpoint "
                                "has one, written by the coordinator)")
        try:
            with self._open() as r:
                names = {t[0] for t in r.tensors}
                if METADATA_TENSOR not in names:
                    raise _errors.error("CAIRN_ERR_CORRUPTION",
                                        f"corrupt data: checkpoint {self._id!r} is not a torch.distributed.checkpoint "
                                        f"checkpoint: model {self._id!r} has no tensor {METADATA_TENSOR!r}")
                blob = r.read([METADATA_TENSOR])[METADATA_TENSOR]
                self._tensor_names = names
        except _errors.CairnError as e:
            raise _in_checkpoint(e, self._id, "reading its metadata") from None
        collecting = gc.isenabled()
        gc.disable()  # unpickling allocates thousands of objects: no full collections meanwhile
        try:
            metadata = pickle.loads(blob.tobytes())
        except Exception as e:  # a truncated or foreign blob: any unpickling error
            raise _errors.error("CAIRN_ERR_CORRUPTION",
                                f"corrupt data: checkpoint {self._id!r}: its metadata ({METADATA_TENSOR!r}, "
                                f"{blob.nbytes} bytes) cannot be read: {type(e).__name__}: {e}") from None
        finally:
            if collecting:
                gc.enable()
        if not isinstance(metadata, Metadata):
            raise _errors.error("CAIRN_ERR_CORRUPTION",
                                f"corrupt data: checkpoint {self._id!r}: {METADATA_TENSOR!r} holds a "
                                f"{type(metadata).__name__}, not DCP Metadata")
        if StorageMeta is not None and hasattr(metadata, "storage_meta"):
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self._load_id
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        storage = metadata.storage_data
        if not isinstance(storage, dict):
            raise _errors.error("CAIRN_ERR_CORRUPTION",
                                f"corrupt data: checkpoint {self._id!r}: its metadata says nowhere where the items "
                                "are stored (storage_data is missing)")
        names = self._tensor_names
        if names is not None:
            missing = sorted({k for k in storage.values() if isinstance(k, str) and k not in names})
            if missing:
                raise _errors.error("CAIRN_ERR_CORRUPTION",
                                    f"corrupt data: checkpoint {self._id!r} lacks {len(missing)} tensor(s) its "
                                    f"metadata lists, e.g. {missing[:3]}")
        self._storage = storage

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: List[LoadPlan]) -> List[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        """Reads this rank's items: mapped zero-copy from the daemon's arena, each copied once into
        the planner's tensor (or into the destination straight, or handed to a
        :class:`ZeroCopyLoadPlanner`)."""
        try:
            with self._open() as r:
                self._read(r, plan, planner)
        except _errors.CairnError as e:
            raise _in_checkpoint(e, self._id, "reading its tensors") from None
        fut: Future = Future()
        fut.set_result(None)
        return fut

    def _key(self, item: ReadItem) -> str:
        key = self._storage.get(item.storage_index)
        if not isinstance(key, str):
            raise _errors.error("CAIRN_ERR_CORRUPTION",
                                f"corrupt data: checkpoint {self._id!r}: its metadata does not say where "
                                f"{item.storage_index.fqn!r} (offset {item.storage_index.offset}) is stored")
        return key

    def _read(self, r: ModelReader, plan: LoadPlan, planner: LoadPlanner) -> None:
        adopt = getattr(planner, "adopt_tensor", None) if isinstance(planner, ZeroCopyLoadPlanner) else None
        direct: List[Tuple[ReadItem, torch.Tensor, str]] = []  # whole tensors straight into host memory
        on_device: List[Tuple[ReadItem, torch.Tensor, str]] = []  # whole tensors straight into CUDA memory
        mapped: List[Tuple[ReadItem, str]] = []  # the rest: from a zero-copy view of the stored shard
        for item in plan.items:
            key = self._key(item)
            info = r.info(key)
            if item.type == LoadItemType.BYTE_IO:
                mapped.append((item, key))
                continue
            whole = all(int(o) == 0 for o in item.storage_offsets) and \
                [int(n) for n in item.lengths] == list(info[2])
            if whole and adopt is not None:
                mapped.append((item, key))
                continue
            dst = planner.resolve_tensor(item).detach()
            if whole and dst.is_contiguous() and _td.cairn_dtype(dst.dtype) == info[1] and \
                    dst.numel() * dst.element_size() == info[3]:
                (on_device if dst.device.type == "cuda" else direct).append((item, dst, key))
                continue
            mapped.append((item, key))
        if direct:
            arrays = {}
            for item, dst, key in direct:
                arrays[key] = dst.reshape(-1).view(torch.uint8).numpy()
            r.read_into(arrays)
            for item, dst, _ in direct:
                planner.commit_tensor(item, dst)
        if on_device:
            self._read_device(r, on_device, planner)
        if not mapped:
            return
        views = r.map(sorted({key for _, key in mapped}), writable=adopt is not None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.from_numpy of read-only views: only read from here
            for item, key in mapped:
                view = views[key]
                if item.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(item, io.BytesIO(view.tobytes()))
                    continue
                src = _td.from_numpy(key, view, r.info(key)[1])
                if adopt is not None and adopt(item, src):
                    continue
                src = _narrow(src, item.storage_offsets, item.lengths)
                dst = planner.resolve_tensor(item).detach()
                if tuple(dst.shape) != tuple(src.shape):
                    raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                                        f"invalid argument: checkpoint {self._id!r}: {item.dest_index.fqn!r} needs "
                                        f"{tuple(dst.shape)}, the stored slice of {key!r} is {tuple(src.shape)}")
                dst.copy_(src)
                planner.commit_tensor(item, dst)
        del views  # the leases end with the last view

    @staticmethod
    def _read_device(r: ModelReader, items: List[Tuple[ReadItem, torch.Tensor, str]], planner: LoadPlanner) -> None:
        """Whole tensors straight into CUDA memory (the library's device copies), else through a
        zero-copy view of the arena."""
        for dev in {dst.device for _, dst, _ in items}:
            torch.cuda.current_stream(dev).synchronize()  # the library's copies run outside torch's streams
        try:
            r.read_device([(key, dst.data_ptr(), dst.numel() * dst.element_size()) for _, dst, key in items
                           if dst.numel()])
        except _errors.Unavailable:
            views = r.map(sorted({key for _, _, key in items}))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for _, dst, key in items:
                    dst.copy_(_td.from_numpy(key, views[key], r.info(key)[1]).view(dst.shape))
            del views
        for item, dst, _ in items:
            planner.commit_tensor(item, dst)
