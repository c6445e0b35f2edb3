"""DeepSpeed checkpoints in cairn: :class:`CairnCheckpointEngine`, a DeepSpeed ``CheckpointEngine``.

``import cairn.deepspeed`` (needs torch and DeepSpeed; the rest of ``cairn`` does not)::

    import deepspeed, cairn.deepspeed

    engine, *_ = deepspeed.initialize(model=model, config=ds_config, model_parameters=params)
    cairn.deepspeed.install(engine, durability="local")      # DeepSpeed has no engine registry
    engine.save_checkpoint("/scratch/run7", tag="step100")   # every rank, as usual
    engine.load_checkpoint("/scratch/run7")                  # "latest", or tag=...

What a checkpoint is: one cairn model per ``save_checkpoint`` call, ``<prefix><abs save_dir>/<tag>``
(``deepspeed:/scratch/run7/step100``; ``#v2``, ``#v3``... when that id is taken), of one part per
rank: rank ``i`` commits part ``i``, holding every file DeepSpeed asked it to save for the tag
(``mp_rank_00_model_states.pt``, ``zero_pp_rank_1_mp_rank_00_optim_states.pt``, ...). A file is
its tensors, named ``<file>/<place in the dict>`` (``mp_rank_00_model_states.pt/module.fc.weight``),
and ``<file>/__pickle__``: the rest of the dict, pickled, with a reference where each tensor was
(what ``torch.save`` writes around its storages). The model becomes visible only when every rank's
part is in: a checkpoint is there whole or not at all.

Each checkpoint is derived from the previous one this engine saved or loaded (its parent): like
every cairn model it stores only the chunks no stored model has, so frozen layers and unchanged
buffers are stored once for the whole run.

``save`` returns once the file's bytes are in the daemon's arena (one copy; the training may then
change them); ``commit`` (called by ``save_checkpoint`` on every rank) commits the rank's part and
waits for the durability asked for, then writes, at each file's path, a pointer file (one line of
JSON naming the model and the file), so that DeepSpeed's own file logic (``latest``, the globs and
existence checks of ``load_checkpoint``) works unchanged. ``load`` reads the pointer file and the
file's tensors from the daemon; an ordinary file is read with ``torch.load``. With
``decoupled=True`` DeepSpeed calls ``commit`` at the next optimizer step instead (and writes
``latest`` then): ``save_checkpoint`` returns once the bytes are in the arena.

See docs/frameworks.md ("DeepSpeed").
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import threading
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np
import torch
import torch.distributed as dist
from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointCommitInfo, CheckpointEngine

from . import _errors
from . import _torch_dtypes as _td
from .client import Client, ModelWriter, Ticket
from .dcp import _shared_client

__all__ = ["CairnCheckpointEngine", "install", "RECORD_KEY", "PICKLE_TENSOR"]

#: The metadata key of a checkpoint's record (format, save_dir, tag, ranks) and of a pointer file.
RECORD_KEY = "cairn.deepspeed"
#: The last name component of each file's pickled remainder (a U8 tensor): ``<file>/__pickle__``.
PICKLE_TENSOR = "__pickle__"
_FORMAT = 1
_POINTER_MAX = 64 << 10
_NAME_MAX = 1024
_DURABILITIES = ("memory", "local", "global")


# ---- a file's dict as tensors + a pickled remainder ----

def _storable(t: Any) -> bool:
    return (type(t) in (torch.Tensor, torch.nn.Parameter) and t.layout == torch.strided and not t.is_quantized
            and _td.cairn_dtype(t.dtype) is not None and t.device.type in ("cpu", "cuda"))


def _tensors_of(obj: Any, file: str) -> Dict[int, Tuple[str, torch.Tensor]]:
    """id(tensor) -> (name, tensor) for every storable tensor reachable through dicts, lists and
    tuples, named by its place (``<file>/optimizer.state.0.exp_avg``); a tensor met twice keeps
    its first name."""
    out: Dict[int, Tuple[str, torch.Tensor]] = {}
    taken: set = set()
    stack: List[Tuple[str, Any]] = [("", obj)]
    while stack:
        path, o = stack.pop()
        if isinstance(o, torch.Tensor):
            if _storable(o) and id(o) not in out:
                name = f"{file}/{path or 'tensor'}"
                if len(name.encode("utf-8")) > _NAME_MAX - 16 or name in taken or name.endswith("/" + PICKLE_TENSOR):
                    name = f"{file}/~{len(out)}"
                taken.add(name)
                out[id(o)] = (name, o)
        elif isinstance(o, Mapping):
            stack.extend((f"{path}.{k}" if path else str(k), v) for k, v in reversed(list(o.items())))
        elif isinstance(o, (list, tuple)):
            stack.extend((f"{path}.{i}" if path else str(i), v) for i, v in reversed(list(enumerate(o))))
    return out


class _Pickler(pickle.Pickler):
    def __init__(self, f: Any, tensors: Mapping[int, Tuple[str, torch.Tensor]]) -> None:
        super().__init__(f, protocol=pickle.HIGHEST_PROTOCOL)
        self._tensors = tensors

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            got = self._tensors.get(id(obj))
            if got is not None and got[1] is obj:
                return ("cairn", got[0], str(obj.device), bool(obj.requires_grad), type(obj) is torch.nn.Parameter)
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, f: Any, tensors: Mapping[str, torch.Tensor], device_of: Any) -> None:
        super().__init__(f)
        self._tensors = tensors
        self._device_of = device_of
        self._built: Dict[str, torch.Tensor] = {}

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "cairn"):
            raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
        _, name, device, grad, param = pid
        if name in self._built:
            return self._built[name]
        if name not in self._tensors:
            raise _errors.error("CAIRN_ERR_CORRUPTION", f"corrupt data: the checkpoint file refers to tensor {name!r}, "
                                                        "which its model does not have")
        t = self._tensors[name]
        dev = self._device_of(device)
        if t.device != dev:
            t = t.to(dev)
        if param:
            t = torch.nn.Parameter(t, requires_grad=grad)
        elif grad:
            t.requires_grad_(True)
        self._built[name] = t
        return t


def _device_mapper(map_location: Any) -> Any:
    """saved device (str) -> torch.device, as ``torch.load``'s ``map_location`` places it (None: where
    it was saved)."""
    def device_of(loc: str) -> torch.device:
        if map_location is None:
            return torch.device(loc)
        if isinstance(map_location, (str, torch.device)):
            return torch.device(map_location)
        if isinstance(map_location, Mapping):
            return torch.device(map_location.get(loc, loc))
        if callable(map_location):
            moved = map_location(torch.empty(0).untyped_storage(), loc)
            return moved.device if moved is not None else torch.device(loc)
        raise TypeError(f"map_location={map_location!r}: expected a device, a str, a dict or a callable")
    return device_of


# ---- pointer files ----

def _read_pointer(path: str) -> Optional[Tuple[str, str]]:
    """(model, file) the pointer file at ``path`` names; None for an ordinary file; FileNotFoundError."""
    with open(path, "rb") as f:
        head = f.read(_POINTER_MAX + 1)
    if len(head) > _POINTER_MAX or not head.lstrip().startswith(b"{"):
        return None
    try:
        rec = json.loads(head)[RECORD_KEY]
        model, file = rec["model"], rec["file"]
    except (ValueError, KeyError, TypeError):
        return None
    return (model, file) if isinstance(model, str) and isinstance(file, str) else None


def _write_pointer(path: str, model: str, file: str) -> None:
    data = (json.dumps({RECORD_KEY: {"format": _FORMAT, "model": model, "file": file}}) + "\n").encode("utf-8")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.cairn-{os.getpid()}-{threading.get_ident()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


def _in_checkpoint(e: _errors.CairnError, doing: str) -> _errors.CairnError:
    return _errors.error(e.status, f"{e.message} ({doing})")


def _rank_and_size() -> Tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


# ---- the engine ----

class CairnCheckpointEngine(CheckpointEngine):
    """DeepSpeed's ``CheckpointEngine`` on cairn (see the module's description); install it with
    :func:`install`.

    Args:
        config_params: DeepSpeed's config (unused; DeepSpeed's engines take it).
        socket: the daemon's Unix socket (default ``$CAIRN_SOCKET``, else the default socket); the
            process's connection to it is shared with cairn.torch, cairn.dcp and cairn.lightning.
        client: a :class:`cairn.Client` to use instead.
        prefix: put before ``<abs save_dir>/<tag>`` in model ids (ids are at most 1024 bytes).
        durability: ``"memory"``, ``"local"`` or ``"global"`` (default): what ``commit`` (the end of
            ``save_checkpoint``) waits for.
        parent_chain: derive each checkpoint from the previous one saved or loaded (default True).
        decoupled: DeepSpeed commits at the next optimizer step, not in ``save_checkpoint``.
        part_timeout: seconds after the first rank's part arrives within which every rank's part
            must arrive, or the checkpoint is dropped (a rank died). Default 600.
        metadata: a JSON object merged into every checkpoint's model metadata.

    One engine per rank (DeepSpeed's); one checkpoint at a time. :class:`cairn.Unavailable`,
    naming the socket and the checkpoint, when the daemon cannot be reached.
    """

    def __init__(self, config_params: Any = None, *, socket: Optional[Union[str, "os.PathLike[str]"]] = None,
                 client: Optional[Client] = None, prefix: str = "deepspeed:", durability: str = "global",
                 parent_chain: bool = True, decoupled: bool = False, part_timeout: float = 600.0,
                 metadata: Optional[Mapping[str, Any]] = None) -> None:
        super().__init__(config_params)
        if durability not in _DURABILITIES:
            raise ValueError(f"CairnCheckpointEngine: durability={durability!r} is not one of 'memory', 'local', "
                             "'global'")
        if metadata is not None and (not isinstance(metadata, Mapping) or RECORD_KEY in metadata):
            raise ValueError(f"CairnCheckpointEngine: metadata must be a dict without the key {RECORD_KEY!r}")
        self.name = "CairnCheckpointEngine"
        self.socket = socket
        self.prefix = prefix
        self.durability = durability
        self.parent_chain = parent_chain
        self.decoupled = decoupled
        self.part_timeout = float(part_timeout)
        self.metadata = dict(metadata or {})
        self._client = client
        self._info: Optional[CheckpointCommitInfo] = None
        self._model: Optional[str] = None  # the model of the checkpoint being saved
        self._parent: Optional[str] = None
        self._writer: Optional[ModelWriter] = None
        self._files: Dict[str, str] = {}  # path -> file name in the model, saved for this checkpoint
        self._previous: Optional[str] = None

    # -- the daemon --

    @property
    def last_model(self) -> Optional[str]:
        """The model the next checkpoint derives from: the last one committed or loaded."""
        return self._previous

    def client(self) -> Client:
        """The client the engine uses (connected on first use)."""
        if self._client is not None:
            return self._client
        return _shared_client(self.socket)

    def _lost(self, c: Client) -> None:
        if c is not self._client:
            with contextlib.suppress(Exception):
                c.close()

    # -- CheckpointEngine --

    def create(self, info: CheckpointCommitInfo) -> None:
        """Picks the checkpoint's model id (the same on every rank: DeepSpeed calls this on all of
        them before any part can be committed). A decoupled checkpoint still pending is committed
        first; one left uncommitted otherwise (a failed save) is dropped."""
        if self.decoupled and self._info is not None:
            self.commit(self._info)
        self._abort()
        base = f"{self.prefix}{os.path.abspath(info.save_dir)}/{info.tag}"
        doing = f"DeepSpeed checkpoint {info.tag!r} in {info.save_dir!r} not saved"
        c = None
        try:
            c = self.client()
            model, v = base, 1
            while True:
                if len(model.encode("utf-8")) > _NAME_MAX:
                    raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                                        f"invalid argument: model id {model[:80]!r}... is longer than {_NAME_MAX} "
                                        "bytes; use a shorter prefix or checkpoint directory")
                try:
                    c.show(model)
                except _errors.NotFound:
                    break
                v += 1
                model = f"{base}#v{v}"
            parent = self._previous if self.parent_chain else None
            if parent is not None:
                try:
                    if c.show(parent).get("collected"):
                        parent = None
                except _errors.NotFound:
                    parent = None
        except _errors.Unavailable as e:
            if c is not None:
                self._lost(c)
            raise _in_checkpoint(e, doing) from None
        self._info, self._model, self._parent, self._files = info, model, parent, {}

    def _open_writer(self) -> ModelWriter:
        if self._writer is None:
            if self._model is None:
                raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                                    "invalid argument: CairnCheckpointEngine.save before create: save through "
                                    "engine.save_checkpoint")
            rank, size = _rank_and_size()
            part = (rank, size) if size > 1 else None
            self._writer = self.client().model_create(self._model, self._parent, part=part, part_timeout=self.part_timeout)
        return self._writer

    def save(self, state_dict: Any, path: str) -> None:
        """Copies the file's tensors into arena space of this rank's part and returns (the caller
        may change them from then on); ``commit`` makes them a checkpoint."""
        info = self._info
        tag_dir = os.path.join(os.path.abspath(info.save_dir), str(info.tag)) if info else os.path.dirname(path)
        file = os.path.relpath(os.path.abspath(path), tag_dir)
        if file.startswith(".."):
            file = os.path.basename(path)
        doing = f"DeepSpeed checkpoint file {path!r} not saved"
        try:
            w = self._open_writer()
            tensors = _tensors_of(state_dict, file)
            buf = io.BytesIO()
            _Pickler(buf, tensors).dump(state_dict)
            batch: Dict[str, np.ndarray] = {}
            dtypes: Dict[str, str] = {}
            for name, t in tensors.values():
                arr, cname = _td.to_numpy(name, t.detach())
                if not arr.flags.c_contiguous:
                    arr = np.ascontiguousarray(arr)
                batch[name], dtypes[name] = arr, cname
            batch[f"{file}/{PICKLE_TENSOR}"] = np.frombuffer(buf.getbuffer(), np.uint8)
            dtypes[f"{file}/{PICKLE_TENSOR}"] = "U8"
            w.add_tensors(batch, dtypes)
        except _errors.Unavailable as e:
            self._abort()
            raise _in_checkpoint(e, doing) from None
        except _errors.CairnError as e:
            self._abort()
            raise _in_checkpoint(e, f"{doing} (model {self._model!r})") from None
        self._files[os.path.abspath(path)] = file

    def load(self, path: str, map_location: Any = None) -> Any:
        """The file at ``path`` as it was saved: read from the model its pointer file names (an
        ordinary file: ``torch.load``). The model becomes the parent of the next checkpoint."""
        try:
            ptr = _read_pointer(path)
        except FileNotFoundError:
            raise FileNotFoundError(f"DeepSpeed checkpoint file not found: {path}") from None
        if ptr is None:
            return torch.load(path, map_location=map_location, weights_only=False)
        model, file = ptr
        doing = f"loading DeepSpeed checkpoint file {path!r} from model {model!r}"
        c = None
        try:
            c = self.client()
            sd = self._load(c, model, file, map_location)
        except _errors.Unavailable as e:
            if c is not None:
                self._lost(c)
            raise _in_checkpoint(e, doing) from None
        except _errors.NotFound as e:
            raise _in_checkpoint(e, f"{doing}: the pointer file names a model or file the daemon does not have") \
                from None
        except _errors.CairnError as e:
            raise _in_checkpoint(e, doing) from None
        self._previous = model
        return sd

    @staticmethod
    def _load(c: Client, model: str, file: str, map_location: Any) -> Any:
        prefix = f"{file}/"
        blob_name = prefix + PICKLE_TENSOR
        with c.model_open(model) as r:
            names = [t[0] for t in r.tensors if t[0].startswith(prefix)]
            if blob_name not in names:
                raise _errors.error("CAIRN_ERR_NOT_FOUND", f"not found: model {model!r} holds no file {file!r}")
            arrays = r.read(names)
            kinds = {t[0]: t[1] for t in r.tensors if t[0].startswith(prefix)}
        blob = arrays.pop(blob_name)
        tensors = {n: _td.from_numpy(n, a, kinds[n]) for n, a in arrays.items()}
        return _Unpickler(io.BytesIO(blob.tobytes()), tensors, _device_mapper(map_location)).load()

    def commit(self, info: CheckpointCommitInfo) -> bool:
        """Commits this rank's part (an empty one when DeepSpeed gave this rank no file), waits for
        the durability, then writes the pointer files of this rank's files."""
        if info is None or self._model is None:
            return False
        model, files = self._model, self._files
        doing = f"DeepSpeed checkpoint {info.tag!r} in {info.save_dir!r} (model {model!r}) not saved"
        c = None
        try:
            c = self.client()
            w = self._open_writer()
            rank, size = _rank_and_size()
            if rank == 0:
                w.set_metadata({**self.metadata, RECORD_KEY: {"format": _FORMAT, "save_dir": os.path.abspath(
                    info.save_dir), "tag": str(info.tag), "ranks": size}})
            self._writer = None
            ticket: Ticket = w.commit(self.durability, pipelined=True)
            ticket.wait()
        except _errors.Unavailable as e:
            self._abort()
            if c is not None:
                self._lost(c)
            raise _in_checkpoint(e, doing) from None
        except _errors.CairnError as e:
            self._abort()
            raise _in_checkpoint(e, doing) from None
        finally:
            self._info = None
            self._model = None
        for path, file in files.items():
            _write_pointer(path, model, file)
        self._previous = model
        return True

    def _abort(self) -> None:
        w, self._writer = self._writer, None
        if w is not None:
            w.abort()
        self._files = {}

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        os.makedirs(path, exist_ok=exist_ok)

    def is_decoupled(self) -> bool:
        return self.decoupled

    def get_commit_info(self) -> Optional[CheckpointCommitInfo]:
        return self._info if self.decoupled else None

    def cleanup(self) -> None:
        """Commits a decoupled checkpoint still pending (DeepSpeed calls this when the engine ends)."""
        if self.decoupled and self._info is not None:
            self.commit(self._info)

    def preserves_storage_sharing(self) -> bool:
        # No clone_tensors_for_torch_save first: ``save`` copies every tensor into the arena anyway.
        return False

    def is_data_parallel_writer(self, dp_rank: int) -> bool:
        return dp_rank == 0


def install(engine: Any, **options: Any) -> CairnCheckpointEngine:
    """Makes ``engine`` (a ``deepspeed.DeepSpeedEngine``) save and load its checkpoints with a
    :class:`CairnCheckpointEngine` built from ``options`` (its keyword arguments), and returns it.
    Call it on every rank after ``deepspeed.initialize`` and before the first ``save_checkpoint``
    or ``load_checkpoint``."""
    ce = CairnCheckpointEngine(getattr(engine, "_config", None), **options)
    old = getattr(engine, "checkpoint_engine", None)
    if old is not None and old.is_decoupled():
        old.cleanup()
    engine.checkpoint_engine = ce
    return ce
