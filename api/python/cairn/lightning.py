"""Lightning checkpoints in cairn: :class:`CairnCheckpointIO`, a ``CheckpointIO`` plugin.

``import cairn.lightning`` (needs torch and Lightning 2; the rest of ``cairn`` does not)::

    from lightning.pytorch import Trainer
    from lightning.pytorch.callbacks import ModelCheckpoint
    from cairn.lightning import CairnCheckpointIO

    trainer = Trainer(plugins=[CairnCheckpointIO()],
                      callbacks=[ModelCheckpoint(monitor="val_loss", save_top_k=2, save_last=True)])
    trainer.fit(model, data)
    trainer.fit(model, data, ckpt_path="last")        # resumes from cairn

What a checkpoint is: one cairn model, ``<prefix><path>#v<k>`` (``lightning:/abs/dir/epoch=3-step=40.ckpt#v1``;
``k`` counts the saves to that path). Every tensor of the checkpoint dict (the state dict, the
optimizer states, the tensors callbacks keep) is a tensor of the model, named by its place in the
dict (``state_dict/fc.weight``, ``optimizer_states/0/state/2/exp_avg``). Everything else -- epoch,
global step, loops, callback states, hyper-parameters, the dict's nesting -- is the model's metadata
record ``"cairn.lightning"`` as typed JSON (tuples, integer keys, key order and non-finite floats kept);
a value JSON cannot hold (an arbitrary object) is pickled with ``torch.save`` into the U8 tensor
``__pickled__`` and read back with ``torch.load`` (``weights_only`` as Lightning passes it). The
checkpoint's ``epoch`` and ``global_step`` are copied to the metadata's top level, for ``where`` filters.

Each checkpoint is derived from the previous one of the run (the last one this plugin saved or
loaded): a tensor equal to the parent's is inherited, so frozen layers and unchanged buffers cost
no bytes and no hashing. At the checkpoint path itself the plugin writes a pointer file (one line
of JSON naming the model), so that ModelCheckpoint's file logic (``ckpt_path="last"``, ``-v1``
suffixes, ``save_last="link"``) works unchanged. See docs/frameworks.md ("Lightning").
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import math
import os
import re
import threading
from collections import OrderedDict
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import torch
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol, get_filesystem

from . import _errors
from . import _torch_dtypes as _td
from . import torch as _ct
from .client import Client
from .dcp import _shared_client

__all__ = ["CairnCheckpointIO", "RECORD_KEY", "PICKLED_TENSOR", "CHECKPOINT_TYPE"]

log = logging.getLogger(__name__)

#: The metadata key of a checkpoint's record (format, path, skeleton), and the key of a pointer file.
RECORD_KEY = "cairn.lightning"
#: The U8 tensor holding the values JSON cannot hold (``torch.save`` of a list), when there are any.
PICKLED_TENSOR = "__pickled__"
_FORMAT = 1
#: The layer type of every checkpoint's one-layer architecture: the catalog's ``find`` query takes it
#: (``{"op": "find", "contains_path": [CHECKPOINT_TYPE], "where": {"epoch": {">=": 10}}}``).
CHECKPOINT_TYPE = "cairn.lightning.checkpoint"
_ARCH = {"layers": [{"name": "checkpoint", "type": CHECKPOINT_TYPE, "config": {}, "inputs": []}]}
_POINTER_MAX = 64 << 10  # a pointer file is one short line; anything longer is an ordinary checkpoint
_VERSION_RE = re.compile(r"#v([1-9][0-9]*)$")
_NAME_MAX = 1024  # bytes of a model id or tensor name (docs/protocol.md)
_INT64 = (-(1 << 63), (1 << 63) - 1)
_DURABILITIES = ("memory", "local", "global")
_STORAGE_OPTIONS = ("durability", "parent", "metadata")


# ---- the checkpoint dict as tensors + typed JSON ----

def _storable(t: torch.Tensor) -> bool:
    """Whether cairn stores ``t`` as a tensor (dense, a dtype it has, on the host or a GPU)."""
    return (type(t) in (torch.Tensor, torch.nn.Parameter) and t.layout == torch.strided and not t.is_quantized
            and _td.cairn_dtype(t.dtype) is not None and t.device.type in ("cpu", "cuda"))


class _Packer:
    """Splits a checkpoint dict into its tensors (name -> tensor, in the dict's order), a JSON
    skeleton with a placeholder where each tensor was, and the values JSON cannot hold.

    Encoding (decoded by :class:`_Unpacker`): None, bools, str, int64 and finite floats as
    themselves; lists as arrays; a plain dict whose keys are str, none starting with ``$``, in sorted
    order (the order the daemon keeps JSON objects in) as an object; any other dict as
    ``{"$dict": [[key, value], ...], "ordered": true (an OrderedDict), "metadata": (its _metadata)}``;
    ``{"$tuple": [...]}``, ``{"$int": "<digits>"}``, ``{"$float": "nan"|"inf"|"-inf"}``;
    ``{"$tensor": name, "device": "cuda:0", "requires_grad": true, "parameter": true}`` (the last
    three only when so); ``{"$pickled": i}``: item ``i`` of the pickled list."""

    def __init__(self) -> None:
        self.tensors: Dict[str, torch.Tensor] = {}
        self.pickled: List[Any] = []
        self._seen: Dict[int, Dict[str, Any]] = {}  # id(tensor) -> placeholder: a tensor met twice is stored once

    def _name(self, path: Tuple[Any, ...]) -> str:
        base = "/".join(k if isinstance(k, str) else repr(k) for k in path) or "tensor"
        if len(base.encode("utf-8")) > _NAME_MAX - 16:
            digest = hashlib.sha1(base.encode("utf-8")).hexdigest()[:16]  # the same name in every process
            base = base.encode("utf-8")[: _NAME_MAX - 48].decode("utf-8", "ignore") + f"~{digest}"
        name, n = base, 1
        while name in self.tensors or name == PICKLED_TENSOR:
            n += 1
            name = f"{base}~{n}"
        return name

    def _pickle(self, value: Any) -> Dict[str, Any]:
        self.pickled.append(value)
        return {"$pickled": len(self.pickled) - 1}

    def _tensor(self, t: torch.Tensor, path: Tuple[Any, ...]) -> Dict[str, Any]:
        seen = self._seen.get(id(t))
        if seen is not None and self.tensors.get(seen["$tensor"]) is t:
            return dict(seen)
        ph: Dict[str, Any] = {"$tensor": self._name(path)}
        if t.device.type != "cpu":
            ph["device"] = str(t.device)
        if t.requires_grad:
            ph["requires_grad"] = True
        if type(t) is torch.nn.Parameter:
            ph["parameter"] = True
        self.tensors[ph["$tensor"]] = t
        self._seen[id(t)] = ph
        return dict(ph)

    def _key(self, k: Any, path: Tuple[Any, ...]) -> Any:
        return self._pickle(k) if isinstance(k, torch.Tensor) else self.pack(k, path)

    def pack(self, obj: Any, path: Tuple[Any, ...] = ()) -> Any:
        t = type(obj)
        if obj is None or t is bool or t is str:
            return obj
        if t is int:
            return obj if _INT64[0] <= obj <= _INT64[1] else {"$int": str(obj)}
        if t is float:
            return obj if math.isfinite(obj) else {"$float": repr(obj)}
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj, path) if _storable(obj) else self._pickle(obj)
        if t is list:
            return [self.pack(v, path + (i,)) for i, v in enumerate(obj)]
        if t is tuple:
            return {"$tuple": [self.pack(v, path + (i,)) for i, v in enumerate(obj)]}
        if t is dict or t is OrderedDict:
            extra = vars(obj) if t is OrderedDict else {}
            if set(extra) - {"_metadata"}:
                return self._pickle(obj)
            keys = list(obj)
            if t is dict and all(type(k) is str and not k.startswith("$") for k in keys) and keys == sorted(keys):
                return {k: self.pack(obj[k], path + (k,)) for k in keys}
            out: Dict[str, Any] = {"$dict": [[self._key(k, path), self.pack(v, path + (k,))] for k, v in obj.items()]}
            if t is OrderedDict:
                out["ordered"] = True
            if "_metadata" in extra:
                out["metadata"] = self.pack(extra["_metadata"], path + ("_metadata",))
            return out
        return self._pickle(obj)


class _Unpacker:
    """Rebuilds a checkpoint dict from its skeleton, its tensors (name -> tensor, on the host or
    already on their device) and its pickled values; ``device_of`` maps a placeholder's saved
    device to where its tensor goes (map_location)."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], pickled: List[Any], device_of: Any) -> None:
        self._tensors = tensors
        self._pickled = pickled
        self._device_of = device_of
        self._built: Dict[str, torch.Tensor] = {}  # a tensor met twice comes back as one object

    def _tensor(self, ph: Mapping[str, Any]) -> torch.Tensor:
        name = ph["$tensor"]
        if name in self._built:
            return self._built[name]
        if name not in self._tensors:
            raise _errors.error("CAIRN_ERR_CORRUPTION", f"corrupt data: the checkpoint's skeleton names tensor {name!r}, "
                                                        "which its model does not have")
        t = self._tensors[name]
        dev = self._device_of(ph.get("device", "cpu"))
        if t.device != dev:
            t = t.to(dev)
        grad = bool(ph.get("requires_grad"))
        if ph.get("parameter"):
            t = torch.nn.Parameter(t, requires_grad=grad)
        elif grad:
            t.requires_grad_(True)
        self._built[name] = t
        return t

    def unpack(self, node: Any) -> Any:
        if isinstance(node, list):
            return [self.unpack(v) for v in node]
        if not isinstance(node, dict):
            return node
        tag = next((k for k in node if k.startswith("$")), None)
        if tag is None:
            return {k: self.unpack(v) for k, v in node.items()}
        value = node[tag]
        if tag == "$tensor":
            return self._tensor(node)
        if tag == "$tuple":
            return tuple(self.unpack(v) for v in value)
        if tag == "$dict":
            d = (OrderedDict if node.get("ordered") else dict)((self.unpack(k), self.unpack(v)) for k, v in value)
            if "metadata" in node:
                d._metadata = self.unpack(node["metadata"])  # type: ignore[attr-defined]
            return d
        if tag == "$int":
            return int(value)
        if tag == "$float":
            return float(value)
        if tag == "$pickled":
            return self._pickled[value]
        raise _errors.error("CAIRN_ERR_CORRUPTION", f"corrupt data: unknown tag {tag!r} in a checkpoint's skeleton")


def _device_mapper(map_location: Any) -> Any:
    """saved device (str) -> torch.device, as ``torch.load``'s ``map_location`` would place it;
    None: the host (as Lightning's TorchCheckpointIO loads)."""
    cache: Dict[str, torch.device] = {}

    def device_of(loc: str) -> torch.device:
        if loc not in cache:
            if map_location is None:
                dev: Any = "cpu"
            elif isinstance(map_location, (str, torch.device)):
                dev = map_location
            elif isinstance(map_location, int):
                dev = torch.device("cuda", map_location)
            elif isinstance(map_location, Mapping):
                dev = map_location.get(loc, loc)
            elif callable(map_location):
                moved = map_location(torch.empty(0).untyped_storage(), loc)  # asked with an empty host storage
                dev = moved.device if moved is not None else loc
            else:
                raise TypeError(f"map_location={map_location!r}: expected a device, a str, a dict or a callable")
            cache[loc] = torch.device(dev)
        return cache[loc]
    return device_of


# ---- pointer files ----

def _read_pointer(path: str) -> Optional[str]:
    """The model id the pointer file at ``path`` names; None for a file that is not a pointer (an
    ordinary checkpoint). FileNotFoundError when there is no file."""
    fs = get_filesystem(path)
    with fs.open(path, "rb") as f:
        head = f.read(_POINTER_MAX + 1)
    if len(head) > _POINTER_MAX or not head.lstrip().startswith(b"{"):
        return None
    try:
        model = json.loads(head)[RECORD_KEY]["model"]
    except (ValueError, KeyError, TypeError):
        return None
    return model if isinstance(model, str) and model else None


def _write_pointer(path: str, model: str) -> None:
    """Writes (or replaces, atomically on a local filesystem) the pointer file at ``path``."""
    data = (json.dumps({RECORD_KEY: {"format": _FORMAT, "model": model}}) + "\n").encode("utf-8")
    fs = get_filesystem(path)
    fs.makedirs(os.path.dirname(path), exist_ok=True)
    if not _is_local_file_protocol(path):
        fs.pipe_file(path, data)
        return
    tmp = f"{path}.cairn-{os.getpid()}-{threading.get_ident()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)  # a symlink at path (save_last="link") is replaced, not followed
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


def _checkpoint_path(path: Any) -> str:
    """The path as the plugin names it in model ids: local paths absolute, URLs as given."""
    p = os.fspath(path)
    if not isinstance(p, str):
        p = os.fsdecode(p)
    if _is_local_file_protocol(p):
        p = os.path.abspath(os.path.expanduser(p[len("file://"):] if p.startswith("file://") else p))
    return p


def _in_checkpoint(e: _errors.CairnError, doing: str) -> _errors.CairnError:
    return _errors.error(e.status, f"{e.message} ({doing})")


# ---- the plugin ----

class CairnCheckpointIO(CheckpointIO):
    """Lightning's ``CheckpointIO`` on cairn: ``Trainer(plugins=[CairnCheckpointIO(...)])``.

    Args:
        socket: the daemon's Unix socket (default ``$CAIRN_SOCKET``, else the default socket, as
            :func:`cairn.connect`); the process's connection to it is shared with cairn.torch/cairn.dcp.
        client: a :class:`cairn.Client` to use instead (``socket`` is then ignored).
        prefix: put before the checkpoint path in model ids (``"lightning:"``); ids are
            ``<prefix><absolute path>#v<k>`` and at most 1024 bytes.
        durability: ``"memory"``, ``"local"`` or ``"global"`` (default): ``save_checkpoint``
            returns once the checkpoint has reached it ("global": in the repository).
        parent_chain: derive each checkpoint from the previous one this plugin saved or loaded (the
            unchanged tensors are inherited: not sent, not stored again). False: every checkpoint
            is stored whole (the repository still stores equal chunks once).
        metadata: a JSON object merged into every checkpoint's model metadata (tags, the task).
        fallback: when the daemon cannot be reached, save with Lightning's ``TorchCheckpointIO``
            (ordinary files at the paths) and log a warning, instead of raising
            :class:`cairn.Unavailable`.

    ``save_checkpoint(..., storage_options={"durability": ..., "parent": ..., "metadata": {...}})``
    overrides those for one save. One save at a time: Lightning calls the plugin from one thread."""

    def __init__(
        self,
        socket: Optional[Union[str, "os.PathLike[str]"]] = None,
        *,
        client: Optional[Client] = None,
        prefix: str = "lightning:",
        durability: str = "global",
        parent_chain: bool = True,
        metadata: Optional[Mapping[str, Any]] = None,
        fallback: bool = False,
    ) -> None:
        if durability not in _DURABILITIES:
            raise ValueError(f"CairnCheckpointIO: durability={durability!r} is not one of 'memory', 'local', 'global'")
        if not isinstance(prefix, str) or "\0" in prefix:
            raise ValueError(f"CairnCheckpointIO: prefix={prefix!r} must be a str without NUL")
        if metadata is not None and (not isinstance(metadata, Mapping) or RECORD_KEY in metadata):
            raise ValueError(f"CairnCheckpointIO: metadata must be a dict without the key {RECORD_KEY!r}")
        self.socket = socket
        self.prefix = prefix
        self.durability = durability
        self.parent_chain = parent_chain
        self.metadata = dict(metadata or {})
        self.fallback = fallback
        self._client = client
        self._lock = threading.Lock()
        self._previous: Optional[str] = None  # the model the next checkpoint derives from
        self._torch_io = TorchCheckpointIO()

    # -- pickling (spawned ranks): the connection is not sent, only where to make it --

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        if state["_client"] is not None:
            state["socket"] = state["_client"].address
        state["_client"] = None
        state.pop("_lock")
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # -- the daemon --

    @property
    def last_model(self) -> Optional[str]:
        """The model the next checkpoint derives from: the last one saved or loaded (None at first)."""
        return self._previous

    def client(self) -> Client:
        """The client the plugin uses (connected on first use). :class:`cairn.Unavailable`, naming
        the socket, when no daemon listens there."""
        if self._client is not None:
            return self._client
        return _shared_client(self.socket)

    def _lost(self, c: Client) -> None:
        """After Unavailable: a shared connection that broke is closed, so the next use connects again."""
        if c is not self._client:
            with contextlib.suppress(Exception):
                c.close()

    # -- CheckpointIO --

    def save_checkpoint(self, checkpoint: Dict[str, Any], path: Any, storage_options: Optional[Any] = None) -> None:
        """Stores ``checkpoint`` as a new model (derived from the previous checkpoint), then writes
        the pointer file at ``path`` and retires the model an earlier save to ``path`` left there.
        Returns once the model has reached the durability asked for."""
        durability, parent, extra = self._options(storage_options)
        key = _checkpoint_path(path)
        try:
            c = self.client()
        except _errors.Unavailable as e:
            if not self.fallback:
                raise _in_checkpoint(e, f"Lightning checkpoint {key!r} not saved; CairnCheckpointIO(fallback=True) "
                                        "writes ordinary checkpoint files while the daemon is unreachable") from None
            return self._fallback_save(checkpoint, key, e)
        try:
            self._save(c, checkpoint, key, durability, parent, extra)
        except _errors.Unavailable as e:
            self._lost(c)
            if not self.fallback:
                raise _in_checkpoint(e, f"Lightning checkpoint {key!r} not saved") from None
            self._fallback_save(checkpoint, key, e)

    def _options(self, storage_options: Optional[Any]) -> Tuple[str, Optional[str], Dict[str, Any]]:
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise TypeError(f"CairnCheckpointIO: storage_options must be a dict with keys {', '.join(_STORAGE_OPTIONS)}, "
                            f"not {type(storage_options).__name__}")
        opts = dict(storage_options or {})
        unknown = sorted(set(opts) - set(_STORAGE_OPTIONS))
        if unknown:
            raise TypeError(f"CairnCheckpointIO: storage option(s) {', '.join(map(repr, unknown))} unknown; "
                            f"the options are {', '.join(_STORAGE_OPTIONS)}")
        durability = opts.get("durability", self.durability)
        if durability not in _DURABILITIES:
            raise ValueError(f"CairnCheckpointIO: storage option durability={durability!r} is not one of "
                             "'memory', 'local', 'global'")
        meta = {**self.metadata, **dict(opts.get("metadata") or {})}
        if RECORD_KEY in meta:
            raise ValueError(f"CairnCheckpointIO: metadata key {RECORD_KEY!r} is reserved")
        return durability, opts.get("parent"), meta

    def _save(self, c: Client, checkpoint: Dict[str, Any], key: str, durability: str, parent: Optional[str],
              extra: Dict[str, Any]) -> None:
        packer = _Packer()
        skeleton = packer.pack(checkpoint)
        tensors: Dict[str, torch.Tensor] = {n: t.detach() for n, t in packer.tensors.items()}
        record: Dict[str, Any] = {"format": _FORMAT, "path": key, "skeleton": skeleton}
        if packer.pickled:
            buf = io.BytesIO()
            torch.save(packer.pickled, buf)
            tensors[PICKLED_TENSOR] = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
            record["pickled"] = PICKLED_TENSOR
        meta: Dict[str, Any] = dict(extra)
        for k in ("epoch", "global_step"):
            if type(checkpoint.get(k)) is int:
                meta[k] = checkpoint[k]
        meta[RECORD_KEY] = record

        old = None if os.path.islink(key) else self._pointer_or_none(key)
        with self._lock:
            wanted = parent if parent is not None else (self._previous if self.parent_chain else None)
        chosen = self._usable_parent(c, wanted)
        if parent is not None and chosen is None:
            raise _errors.error("CAIRN_ERR_NOT_FOUND", f"not found: storage option parent={parent!r}: no such model "
                                                       f"(Lightning checkpoint {key!r})")
        start = 1
        if old is not None and _VERSION_RE.search(old):
            start = int(_VERSION_RE.search(old).group(1)) + 1  # type: ignore[union-attr]
        for _ in range(16):
            model = self._free_id(c, key, start)
            try:
                _ct.save(tensors, model, chosen, meta, client=c, arch=_ARCH, durability=durability, wait=True)
                break
            except _errors.AlreadyExists:
                start = int(_VERSION_RE.search(model).group(1)) + 1  # type: ignore[union-attr]  # another writer took it
            except _errors.Unavailable:
                raise  # save_checkpoint names the checkpoint (and falls back when asked to)
            except _errors.CairnError as e:
                raise _in_checkpoint(e, f"saving Lightning checkpoint {key!r} as model {model!r}") from None
        else:
            raise _errors.error("CAIRN_ERR_EXISTS", f"already exists: other writers kept taking the next model id of "
                                                    f"Lightning checkpoint {key!r}; try again")
        _write_pointer(key, model)
        if old is not None and old != model:
            with contextlib.suppress(_errors.NotFound):
                c.remove(old)
        with self._lock:
            self._previous = model

    @staticmethod
    def _pointer_or_none(key: str) -> Optional[str]:
        try:
            return _read_pointer(key)
        except (FileNotFoundError, NotADirectoryError):
            return None

    @staticmethod
    def _usable_parent(c: Client, parent: Optional[str]) -> Optional[str]:
        """``parent`` when its tensors can still be read (a retired model can; one collected by gc not)."""
        if parent is None:
            return None
        try:
            shown = c.show(parent)
        except _errors.NotFound:
            return None
        return None if shown.get("collected") else parent

    def _free_id(self, c: Client, key: str, start: int) -> str:
        """The first free id ``<prefix><key>#v<k>`` with k >= start (ids of retired models stay taken
        until gc): probed at start, start+1, start+3, start+7, ..."""
        v, step = start, 1
        while True:
            model = f"{self.prefix}{key}#v{v}"
            if len(model.encode("utf-8")) > _NAME_MAX:
                raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                                    f"invalid argument: model id {model[:80]!r}... of Lightning checkpoint {key!r} is "
                                    f"longer than {_NAME_MAX} bytes; use a shorter prefix or checkpoint directory")
            try:
                c.show(model)
            except _errors.NotFound:
                return model
            v += step
            step *= 2

    def _fallback_save(self, checkpoint: Dict[str, Any], key: str, why: _errors.CairnError) -> None:
        log.warning("cairn.lightning: %s; saving Lightning checkpoint %s with TorchCheckpointIO instead (fallback=True)",
                    why.message, key)
        self._torch_io.save_checkpoint(checkpoint, key)

    def load_checkpoint(self, path: Any, map_location: Optional[Any] = None,
                        weights_only: Optional[bool] = None) -> Dict[str, Any]:
        """The checkpoint at ``path``: the model its pointer file names, as the dict that was saved
        (tensors of the same dtypes, shapes and values, placed by ``map_location`` as
        ``torch.load`` would; None: on the host). A file that is not a pointer (an ordinary
        checkpoint) is loaded with TorchCheckpointIO. The loaded model becomes the parent of the
        next save."""
        key = _checkpoint_path(path)
        try:
            model = _read_pointer(key)
        except FileNotFoundError:
            raise FileNotFoundError(f"Checkpoint file not found: {key}") from None
        if model is None:
            return self._torch_io.load_checkpoint(
                key, map_location=map_location if map_location is not None else (lambda storage, loc: storage),
                weights_only=weights_only)
        doing = f"loading Lightning checkpoint {key!r} from model {model!r}"
        try:
            c = self.client()
        except _errors.Unavailable as e:
            raise _in_checkpoint(e, doing) from None
        try:
            ckpt = self._load(c, model, map_location, weights_only)
        except _errors.Unavailable as e:
            self._lost(c)
            raise _in_checkpoint(e, doing) from None
        except _errors.NotFound as e:
            raise _in_checkpoint(e, f"{doing}: the pointer file names a model the daemon does not have") from None
        except _errors.CairnError as e:
            raise _in_checkpoint(e, doing) from None
        with self._lock:
            self._previous = model
        return ckpt

    def _load(self, c: Client, model: str, map_location: Any, weights_only: Optional[bool]) -> Dict[str, Any]:
        shown = c.show(model)
        record = (shown.get("metadata") or {}).get(RECORD_KEY)
        if not isinstance(record, dict) or "skeleton" not in record:
            raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                                f"invalid argument: model {model!r} is not a Lightning checkpoint saved by "
                                f"cairn.lightning (its metadata has no {RECORD_KEY!r} record)")
        if record.get("format") != _FORMAT:
            raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                                f"invalid argument: model {model!r} holds a cairn.lightning checkpoint of format "
                                f"{record.get('format')!r}; this cairn reads format {_FORMAT}")
        device_of = _device_mapper(map_location)
        devices = {str(device_of(loc)) for loc in _saved_devices(record["skeleton"])} or {"cpu"}
        one = torch.device(devices.pop()) if len(devices) == 1 else torch.device("cpu")
        # Owned tensors (one copy): Lightning keeps the optimizer's state tensors for the whole run.
        tensors = _ct.load(model, device=one, client=c, copy=True)
        pickled: List[Any] = []
        blob = record.get("pickled")
        if blob:
            raw = tensors.pop(blob).cpu().numpy().tobytes()
            pickled = torch.load(io.BytesIO(raw), map_location=map_location if map_location is not None else "cpu",
                                 weights_only=weights_only)
        return _Unpacker(tensors, pickled, device_of).unpack(record["skeleton"])

    def remove_checkpoint(self, path: Any) -> None:
        """Retires the model the pointer file at ``path`` names (``cairn rm``: it leaves ``cairn ls``
        and stays readable, and in the lineage, until ``cairn gc``), then removes the pointer file.
        A symbolic link at ``path`` (``save_last="link"``) is only unlinked; an ordinary checkpoint
        file is removed as TorchCheckpointIO does; no file: nothing happens."""
        key = _checkpoint_path(path)
        if os.path.islink(key):
            os.remove(key)
            return
        model = self._pointer_or_none(key)
        if model is None:
            self._torch_io.remove_checkpoint(key)
            return
        try:
            c = self.client()
            try:
                c.remove(model)
            except _errors.NotFound:
                pass
            except _errors.Unavailable:
                self._lost(c)
                raise
        except _errors.Unavailable as e:
            if not self.fallback:
                raise _in_checkpoint(e, f"Lightning checkpoint {key!r} not removed: model {model!r} is still live") \
                    from None
            log.warning("cairn.lightning: %s; removing the pointer file %s only: model %s stays live (`cairn rm %s` "
                        "retires it)", e.message, key, model, model)
        get_filesystem(key).rm(key)

    def teardown(self) -> None:
        """Nothing to release: every save has reached its durability when it returned, and the
        connection is the process's (it ends with the process)."""


def _saved_devices(skeleton: Any) -> List[str]:
    """The devices the skeleton's tensors were saved from."""
    out: List[str] = []
    stack = [skeleton]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            if "$tensor" in node:
                out.append(node.get("device", "cpu"))
            else:
                stack.extend(node.values())
    return out
