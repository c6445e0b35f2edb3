"""What `cairn://` files are made of: the record a file version keeps in its model's metadata, the
layout of its pieces, models of other writers seen as directories, and the path rules (internal to
:mod:`cairn.fsspec`)."""
from __future__ import annotations

import contextlib
import errno
import json
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Mapping, Optional, Set, Tuple

from . import _errors
from .client import Client

#: Metadata key of a cairn:// file's record (size, sha256, layout, path, created_ns).
RECORD_KEY = "cairn.fsspec"
#: Separates a file's path from its version in the model id: ``run1/last.ckpt#v3``.
VERSION_MARK = "#v"
_VERSION_RE = re.compile(r"(.+)#v([1-9][0-9]*)", re.DOTALL)

# Every file's model has this one-layer architecture: the catalog's `find` query looks for its type.
_FILE_TYPE = "cairn.fsspec.file"
_FILE_ARCH = {"layers": [{"name": "file", "type": _FILE_TYPE, "config": {}, "inputs": []}]}
_FIND_ALL = 1 << 62  # a `find` limit that is no limit
_PIN_LIMIT = 256 << 20  # cat_file keeps a range up to this long leased in the arena until it is copied

_DURABILITIES = ("memory", "local", "global")
_WRITE_OPTIONS = ("durability", "parent", "metadata")
# Options of fsspec itself that every filesystem accepts (its listings cache, which this one does not use).
_FSSPEC_OPTIONS = ("use_listings_cache", "listings_expiry_time", "max_paths")


# ---- paths, records, errors ----

def _join(pieces: Iterator[memoryview], length: int, hasher: Any = None) -> bytes:
    """The concatenation of ``pieces`` (``length`` bytes in all), hashed into ``hasher`` on the way.

    Up to _PIN_LIMIT bytes, the pieces (views of the daemon's arena) are kept, with their leases, and
    copied once by the join; a longer range is copied piece by piece first, so that it never holds
    more than one request's worth of the arena."""
    keep = length <= _PIN_LIMIT
    parts: List[Any] = []
    for v in pieces:
        if hasher is not None:
            hasher.update(v)
        parts.append(v if keep else bytes(v))
    return b"".join(parts)


def _split_key(key: str) -> List[str]:
    return key.split("/") if key else []


def _addressable(name: str) -> bool:
    """Whether a path, model id or tensor name is one this filesystem can name: non-empty
    ``/``-separated components, none ``.`` or ``..``."""
    return bool(name) and all(c not in ("", ".", "..") for c in name.split("/"))


def _below(key: str) -> Any:
    """A ``where`` filter on a record's path: every path below directory ``key`` (all for the root)."""
    return {"exists": True} if not key else {">=": key + "/", "<": key + "0"}  # '0' follows '/'


def _fs_error(e: _errors.CairnError, path: str) -> BaseException:
    """A cairn error as the OSError that fsspec callers expect, naming the path."""
    msg = f"cairn://{path}: {e.message}"
    if isinstance(e, _errors.NotFound):
        return FileNotFoundError(errno.ENOENT, msg)
    if isinstance(e, _errors.AlreadyExists):
        return FileExistsError(errno.EEXIST, msg)
    if isinstance(e, _errors.PermissionDenied):
        return PermissionError(errno.EACCES, msg)
    return e


@contextlib.contextmanager
def _as_os_errors(path: str) -> Iterator[None]:
    try:
        yield
    except (_errors.NotFound, _errors.AlreadyExists, _errors.PermissionDenied) as e:
        raise _fs_error(e, path) from e


def _check_write_options(durability: Any, parent: Any, metadata: Any, where: str) -> None:
    if durability not in _DURABILITIES:
        raise ValueError(f"{where}: durability={durability!r} is not one of 'memory', 'local', 'global'")
    if parent is not None and (not isinstance(parent, str) or not parent or "\0" in parent):
        raise ValueError(f"{where}: parent={parent!r} is not a model id (a non-empty str without NUL)")
    if metadata is not None:
        if not isinstance(metadata, Mapping) or not all(isinstance(k, str) for k in metadata):
            raise ValueError(f"{where}: metadata must be a JSON object (a dict with str keys), "
                             f"not {type(metadata).__name__}")
        if RECORD_KEY in metadata:
            raise ValueError(f"{where}: metadata key {RECORD_KEY!r} is reserved (it records the file's size and hash)")
        try:
            json.dumps(dict(metadata), allow_nan=False)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: metadata is not JSON: {e}") from None


@dataclass
class _FileEntry:
    """A file written through cairn://: its newest live version and the older live ones."""
    path: str
    model: str
    version: int
    older: List[str] = field(default_factory=list)


@dataclass
class _Layout:
    """How a stored file (or a foreign model's tensor) maps onto tensors of one model."""
    model: str
    names: List[str]
    offsets: List[int]  # len(names) + 1 entries: tensor i holds bytes [offsets[i], offsets[i+1])
    record: Optional[Dict[str, Any]]  # the file's record; None for a foreign tensor
    commit_ns: int  # when the model was committed
    client: Client  # the connection it was found on, which reads it

    @property
    def size(self) -> int:
        return self.offsets[-1]


@dataclass
class _Foreign:
    """A model not written through cairn:// (a directory of its tensors) and a path inside it."""
    model: str
    rel: str  # the path below the model's directory ("" for the directory itself)
    shown: Dict[str, Any]

    def tensors(self) -> Dict[str, Tuple[str, int]]:
        """{tensor name: (tensor name, nbytes)} of the tensors whose names are paths."""
        return {t["name"]: (t["name"], int(t["nbytes"])) for t in self.shown.get("tensors", [])
                if _addressable(t["name"])}

    def dirs(self) -> Set[str]:
        """The directories the tensor names imply, relative to the model's ("" included)."""
        out = {""}
        for name in self.tensors():
            parts = name.split("/")
            out.update("/".join(parts[:i]) for i in range(1, len(parts)))
        return out
