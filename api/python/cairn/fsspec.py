"""``cairn://`` for fsspec: ordinary files stored in cairn as content-chunked models.

Registered through the ``fsspec.specs`` entry point of the installed package, so that
``fsspec.open("cairn://run1/epoch=3.ckpt")`` works without importing cairn first::

    import fsspec, torch

    with fsspec.open("cairn://run1/epoch=3.ckpt", "wb") as f:      # committed on close
        torch.save(model.state_dict(), f)
    with fsspec.open("cairn://run1/epoch=3.ckpt", "rb") as f:
        sd = torch.load(f)

    fs = fsspec.filesystem("cairn", durability="memory", metadata={"epoch": 3})
    fs.pipe_file("run1/notes.json", b'{"lr": 0.1}')
    fs.cp_file("run1/epoch=3.ckpt", "best.ckpt")                     # no bytes copied

What a path is
    A file written through ``cairn://`` at path ``P`` is the model ``P#v<k>``: version ``k`` of the
    file (1 for the first write), whose metadata record names ``P``. Overwriting commits
    ``P#v<k+1>`` (its parent: the version it replaces) and then retires the older versions
    (``cairn rm``): the file is always the live model of record ``P`` with the highest ``k``, found
    with a catalog query, never by listing every model. Directories are the ``/``-separated
    prefixes of those paths (nothing stores them; ``mkdir`` only checks that no file is in the way).
    Any other model (``cairn put``, ``cairn.torch.save``, ...) is a read-only directory at its id,
    holding one file per tensor (the tensor's raw bytes); it is found at its id, not listed by the
    directories above it.

How a file is stored
    Its bytes are cut into pieces, each stored as a U8 tensor, so that the repository (which stores
    each 16 MiB chunk of a tensor once, by content) keeps a piece that another version or another
    file repeats only once. A ``torch.save`` archive (an uncompressed zip holding
    ``<archive>/data/<key>`` records) stores each record -- a tensor's storage, byte for byte -- as a
    tensor of its own, so its chunks are those :func:`cairn.torch.save` stores for the same tensor;
    the archive's other bytes, and every other file, are cut where a hash of the 32 bytes before a
    position passes a test (content-defined: an insertion moves only the cuts next to it), pieces
    of :data:`MIN_PIECE` to :data:`MAX_PIECE` bytes, about :data:`AVG_PIECE` (:func:`content_cuts`).
    The model's metadata records the file's size and SHA-256 under ``"cairn.fsspec"``; whole-file
    reads check both.

docs/python.md ("fsspec: cairn://") lists the storage options, what each operation does and what
is refused.
"""
from __future__ import annotations

import bisect
import contextlib
import datetime
import errno
import hashlib
import mmap
import os
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Set, Tuple, Union

import numpy as np
from fsspec.callbacks import DEFAULT_CALLBACK
from fsspec.spec import AbstractFileSystem
from fsspec.utils import isfilelike, stringify_path

from . import _errors
from ._file_pieces import (_LOOSE_BITS, _STRICT_BITS, _WINDOW, AVG_PIECE, MAX_PIECE, MIN_PIECE, content_cuts,
                           file_segments)
from ._fsspec_file import CairnFile
from ._fsspec_records import (_FILE_ARCH, _FILE_TYPE, _FIND_ALL, _FSSPEC_OPTIONS, _VERSION_RE, _WRITE_OPTIONS,
                              RECORD_KEY, VERSION_MARK, _addressable, _as_os_errors, _below, _check_write_options,
                              _FileEntry, _Foreign, _fs_error, _join, _Layout, _split_key)
from .client import Client, connect

__all__ = ["CairnFileSystem", "CairnFile", "content_cuts", "file_segments", "MIN_PIECE", "AVG_PIECE",
           "MAX_PIECE", "RECORD_KEY", "VERSION_MARK"]


class CairnFileSystem(AbstractFileSystem):
    """fsspec's view of a cairn daemon: protocol ``cairn`` (see the module's documentation).

    Storage options (each also a keyword of ``open``/``pipe_file``/``put_file``/``cp_file`` for one
    write):

    - ``socket``: the daemon's Unix socket; default ``$CAIRN_SOCKET`` (read at each operation), else
      the default socket, as :func:`cairn.connect`.
    - ``durability``: ``"memory"``, ``"local"`` or ``"global"`` (default): what a write waits for
      before it returns (``close`` of a file opened for writing, ``pipe_file``, ``put_file``, ...).
    - ``parent``: the model id recorded as the parent of every model written; default: the version
      the write replaces (none for a new path). A copy's parent is always its source.
    - ``metadata``: a JSON object merged into the metadata of every model written (the key
      ``"cairn.fsspec"`` is the file's record and reserved).

    Files are found with catalog queries on their records (``find`` with a ``where`` on the path),
    never by listing every model; a model not written through cairn:// is found at its id only.
    Thread-safe: one connection per process, shared by threads (calls are serialised); after a
    ``fork`` the child connects again on its first call.
    """

    protocol = "cairn"
    root_marker = ""

    def __init__(self, socket: Optional[Union[str, "os.PathLike[str]"]] = None, durability: str = "global",
                 parent: Optional[str] = None, metadata: Optional[Mapping[str, Any]] = None,
                 **storage_options: Any) -> None:
        unknown = [k for k in storage_options if k not in _FSSPEC_OPTIONS]
        if unknown:
            raise TypeError(f"cairn:// storage option {unknown[0]!r} is unknown; the options are socket, durability, "
                            f"parent, metadata (and fsspec's {', '.join(_FSSPEC_OPTIONS)})")
        if socket is not None and not isinstance(socket, (str, os.PathLike)):
            raise ValueError(f"cairn:// storage option socket={socket!r} is not a path")
        _check_write_options(durability, parent, metadata, "cairn:// storage option")
        super().__init__(**storage_options)
        self.socket = os.fspath(socket) if socket is not None else None
        self.durability = durability
        self.parent = parent
        self.metadata = dict(metadata) if metadata is not None else {}
        self._lock = threading.Lock()
        self._client: Optional[Client] = None
        self._client_key: Optional[Tuple[int, Optional[str]]] = None

    # ---- the connection ----

    @property
    def client(self) -> Client:
        """The connection to the daemon (made on first use; again after a fork, or when
        ``$CAIRN_SOCKET`` changed for a filesystem without a ``socket`` option)."""
        want = self.socket if self.socket is not None else os.environ.get("CAIRN_SOCKET")
        key = (os.getpid(), want)
        with self._lock:
            if self._client is None or self._client.closed or self._client_key != key:
                if self._client is not None and self._client_key is not None and self._client_key[0] == key[0]:
                    self._client.close()
                self._client = connect(want)
                self._client_key = key
            return self._client

    @property
    def fsid(self) -> str:
        return f"cairn:{self.client.address}"

    # ---- paths ----

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = stringify_path(path)
        if path.startswith("cairn://"):
            path = path[len("cairn://"):]
        elif path.startswith("cairn::"):
            path = path[len("cairn::"):]
        if "://" in path:
            return path  # another protocol's URL: _key refuses it by name
        return "/".join(p for p in path.split("/") if p)

    def _key(self, path: Any) -> str:
        """``path`` (a cairn:// URL or a path) as this filesystem's key; ValueError naming what is
        wrong with it."""
        key = self._strip_protocol(path)
        if not isinstance(key, str):
            raise ValueError(f"cairn:// path {path!r} is not a string")
        if "://" in key:
            raise ValueError(f"{path!r} is not a cairn:// URL (this filesystem is cairn://)")
        if "\0" in key:
            raise ValueError(f"cairn:// path {path!r} contains a NUL character")
        if any(c in (".", "..") for c in _split_key(key)):
            raise ValueError(f"cairn:// path {path!r}: '.' and '..' are not path components here")
        return key

    def _writable_key(self, path: Any) -> str:
        key = self._key(path)
        if not key:
            raise IsADirectoryError(errno.EISDIR, "cairn://: the root is a directory, not a file")
        if "?" in key:
            raise ValueError(f"cairn://{key}: paths take no '?' query here; give parent, durability and metadata "
                             f"as storage options")
        if len(key.encode("utf-8")) > 1000:
            raise ValueError(f"cairn://{key[:60]}...: the path is too long (a model id is at most 1024 bytes of UTF-8, "
                             f"'{VERSION_MARK}<version>' included)")
        return key

    # ---- the catalog ----

    def _find_files(self, path_filter: Any, limit: int = _FIND_ALL) -> Dict[str, List[Tuple[int, str]]]:
        """The live versions of the files whose record's path passes ``path_filter`` (a catalog
        ``where`` value): {path: [(version, model id), ...] ascending}. One ``find`` query."""
        ids = self.client.query({"op": "find", "contains_path": [_FILE_TYPE],
                                 "where": {RECORD_KEY: {"path": path_filter}}, "limit": limit}).get("models", [])
        out: Dict[str, List[Tuple[int, str]]] = {}
        for mid in ids:
            m = _VERSION_RE.fullmatch(mid)
            if m and _addressable(m.group(1)):
                out.setdefault(m.group(1), []).append((int(m.group(2)), mid))
        for versions in out.values():
            versions.sort()
        return out

    @staticmethod
    def _entry(path: str, versions: List[Tuple[int, str]]) -> _FileEntry:
        return _FileEntry(path, versions[-1][1], versions[-1][0], [mid for _, mid in versions[:-1]])

    def _file(self, key: str) -> Optional[_FileEntry]:
        """The file written through cairn:// at ``key``, if there is one."""
        if not key:
            return None
        versions = self._find_files(key).get(key)
        return self._entry(key, versions) if versions else None

    def _has_files_below(self, key: str) -> bool:
        return bool(self._find_files(_below(key), limit=1))

    def _show(self, model: str) -> Optional[Dict[str, Any]]:
        """``show`` of a live model (None when there is none, or it was removed)."""
        try:
            shown = self.client.show(model)
        except _errors.NotFound:
            return None
        return None if shown.get("retired_ns") or shown.get("collected") else shown

    def _foreign(self, key: str) -> Optional[_Foreign]:
        """The model not written through cairn:// whose directory is ``key`` or holds it (the
        longest such model id), if any: one ``show`` per path component at most."""
        parts = _split_key(key)
        for i in range(len(parts), 0, -1):
            mid = "/".join(parts[:i])
            shown = self._show(mid)
            if shown is not None and RECORD_KEY not in (shown.get("metadata") or {}):
                return _Foreign(mid, "/".join(parts[i:]), shown)
        return None

    def _layout_of(self, model: str) -> _Layout:
        """The layout of a file's model; checks its record against its tensors."""
        client = self.client
        with _as_os_errors(model):
            shown = client.show(model)
        record = (shown.get("metadata") or {}).get(RECORD_KEY)
        if not isinstance(record, dict) or "size" not in record or "sha256" not in record:
            raise OSError(errno.EIO, f"model {model!r} has no {RECORD_KEY!r} record in its metadata, so it is not a "
                                     f"file written through cairn://; read it with cairn.Client.load_model")
        names, offsets = [], [0]
        for t in shown.get("tensors", []):
            names.append(t["name"])
            offsets.append(offsets[-1] + int(t["nbytes"]))
        if offsets[-1] != int(record["size"]):
            raise OSError(errno.EIO, f"model {model!r}: its tensors hold {offsets[-1]} bytes but its record says the "
                                     f"file has {record['size']}; the model is damaged")
        return _Layout(model, names, offsets, record, int(shown.get("created_ns", 0)), client)

    # ---- listing ----

    @staticmethod
    def _file_info(f: _FileEntry, layout: Optional[_Layout]) -> Dict[str, Any]:
        info: Dict[str, Any] = {"name": f.path, "size": layout.size if layout else None, "type": "file",
                                "model": f.model, "version": f.version}
        if layout is not None:
            info["created_ns"] = layout.commit_ns
        return info

    @staticmethod
    def _model_info(fm: _Foreign) -> Dict[str, Any]:
        return {"name": fm.model, "size": 0, "type": "directory", "model": fm.model,
                "tensors": len(fm.shown.get("tensors", [])), "created_ns": int(fm.shown.get("created_ns", 0))}

    @staticmethod
    def _tensor_info(fm: _Foreign, rel: str, t: Tuple[str, int]) -> Dict[str, Any]:
        return {"name": f"{fm.model}/{rel}", "size": t[1], "type": "file", "model": fm.model, "tensor": t[0],
                "created_ns": int(fm.shown.get("created_ns", 0))}

    def _foreign_entries(self, fm: _Foreign, below: Optional[str],
                         maxdepth: Optional[int]) -> Dict[str, Dict[str, Any]]:
        """Entries inside foreign model ``fm``: below directory ``below`` (relative; None: the
        immediate children of ``fm.rel``), to ``maxdepth`` levels."""
        tensors, dirs = fm.tensors(), fm.dirs()
        base = fm.rel if below is None else below
        prefix = base + "/" if base else ""
        base_depth = len(_split_key(base))
        out: Dict[str, Dict[str, Any]] = {}
        for d in dirs:
            depth = len(_split_key(d)) - base_depth
            if d.startswith(prefix) and d != base and (depth == 1 if below is None else
                                                       (maxdepth is None or depth <= maxdepth)):
                out[f"{fm.model}/{d}"] = {"name": f"{fm.model}/{d}", "size": 0, "type": "directory", "model": fm.model}
        for rel, t in tensors.items():
            depth = len(_split_key(rel)) - base_depth
            if rel.startswith(prefix) and (depth == 1 if below is None else (maxdepth is None or depth <= maxdepth)):
                out[f"{fm.model}/{rel}"] = self._tensor_info(fm, rel, t)
        return out

    def ls(self, path: Any, detail: bool = True, **kwargs: Any) -> List[Any]:
        """The entries of directory ``path`` (or ``[info(path)]`` for a file), sorted: the files
        written through cairn:// and the directories their paths imply; inside a model's directory,
        its tensors. Files carry ``model`` (the model id of the current version), ``version`` and
        ``created_ns``; a model's directory carries ``model`` and ``tensors``; its tensors
        ``model`` and ``tensor``. With ``detail``, one ``show`` per file listed (its size)."""
        key = self._key(path)
        f = self._file(key)
        if f is not None:
            return [self._file_info(f, self._layout_of(f.model))] if detail else [key]
        prefix = key + "/" if key else ""
        entries: Dict[str, Any] = {}
        files = self._find_files(_below(key))
        for p, versions in files.items():
            rest = p[len(prefix):]
            if "/" in rest:
                child = prefix + rest.split("/", 1)[0]
                entries.setdefault(child, {"name": child, "size": 0, "type": "directory"})
            else:
                entries[p] = self._entry(p, versions)
        fm = self._foreign(key) if key else None
        if fm is not None:
            inside = self._foreign_entries(fm, None, None)
            if not inside and fm.rel and fm.rel not in fm.dirs():
                if fm.rel in fm.tensors():
                    t = self._tensor_info(fm, fm.rel, fm.tensors()[fm.rel])
                    return [t] if detail else [t["name"]]
                fm = None
            for name, e in inside.items():
                entries.setdefault(name, e)
        if not entries and fm is None and key:
            raise FileNotFoundError(errno.ENOENT, f"cairn://{key}: no such file or directory")
        out = []
        for name in sorted(entries):
            e = entries[name]
            if isinstance(e, _FileEntry):
                e = self._file_info(e, self._layout_of(e.model) if detail else None)
            out.append(e if detail else e["name"])
        return out

    def info(self, path: Any, **kwargs: Any) -> Dict[str, Any]:
        """The file or directory at ``path``: a file written through cairn:// (one ``find`` and one
        ``show``), a directory of such files, a model's directory, or one of its tensors."""
        key = self._key(path)
        if not key:
            return {"name": "", "size": 0, "type": "directory"}
        f = self._file(key)
        if f is not None:
            return self._file_info(f, self._layout_of(f.model))
        if self._has_files_below(key):
            return {"name": key, "size": 0, "type": "directory"}
        fm = self._foreign(key)
        if fm is not None:
            if not fm.rel:
                return self._model_info(fm)
            tensors = fm.tensors()
            if fm.rel in tensors:
                return self._tensor_info(fm, fm.rel, tensors[fm.rel])
            if fm.rel in fm.dirs():
                return {"name": key, "size": 0, "type": "directory", "model": fm.model}
        raise FileNotFoundError(errno.ENOENT, f"cairn://{key}: no such file or directory")

    def find(self, path: Any, maxdepth: Optional[int] = None, withdirs: bool = False, detail: bool = False,
             **kwargs: Any) -> Any:
        """Every file below ``path`` (and directory, with ``withdirs``), as fsspec's ``find``: the
        files written through cairn:// (one ``find`` query; with ``detail``, a ``show`` each) and,
        inside a model's directory, its tensors. Models not written through cairn:// below
        ``path`` are not searched for (they are found at their ids)."""
        if maxdepth is not None and maxdepth < 1:
            raise ValueError("maxdepth must be at least 1")
        key = self._key(path)
        base_depth = len(_split_key(key))
        out: Dict[str, Any] = {}
        for p, versions in self._find_files(_below(key)).items():
            parts = _split_key(p)
            if maxdepth is None or len(parts) - base_depth <= maxdepth:
                out[p] = self._entry(p, versions)
            if withdirs:
                for i in range(base_depth + 1, len(parts)):
                    if maxdepth is None or i - base_depth <= maxdepth:
                        d = "/".join(parts[:i])
                        out.setdefault(d, {"name": d, "size": 0, "type": "directory"})
        fm = self._foreign(key) if key else None
        if fm is not None and (not fm.rel or fm.rel in fm.dirs()):
            for name, e in self._foreign_entries(fm, fm.rel, maxdepth).items():
                if e["type"] == "file" or withdirs:
                    out.setdefault(name, e)
        if withdirs and key and key not in out:
            with contextlib.suppress(FileNotFoundError):
                info = self.info(key)
                if info["type"] == "directory":
                    out[key] = info
        if not out and key:
            with contextlib.suppress(FileNotFoundError):
                info = self.info(key)
                if info["type"] == "file":
                    out[key] = info
        names = sorted(out)
        if not detail:
            return names
        result = {}
        for n in names:
            e = out[n]
            result[n] = self._file_info(e, self._layout_of(e.model)) if isinstance(e, _FileEntry) else e
        return result

    def created(self, path: Any) -> datetime.datetime:
        """When the file at ``path`` was first written (since it last did not exist); for a model's
        tensor, when the model was committed. UTC."""
        info = self.info(path)
        if info["type"] != "file":
            raise IsADirectoryError(errno.EISDIR, f"cairn://{info['name']}: a directory has no timestamps")
        ns = int(info["created_ns"])
        if "version" in info:
            record = self._layout_of(info["model"]).record or {}
            ns = int(record.get("created_ns", ns))
        return datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.timezone.utc)

    def modified(self, path: Any) -> datetime.datetime:
        """When the current version of the file at ``path`` was committed (for a model's tensor,
        when the model was). UTC."""
        info = self.info(path)
        if info["type"] != "file":
            raise IsADirectoryError(errno.EISDIR, f"cairn://{info['name']}: a directory has no timestamps")
        return datetime.datetime.fromtimestamp(int(info["created_ns"]) / 1e9, tz=datetime.timezone.utc)

    def checksum(self, path: Any) -> int:
        """The file's SHA-256 (from its record) as an int; for a model's tensor, a hash of the
        model's id, the tensor's name and the model's commit time."""
        info = self.info(path)
        if info["type"] != "file":
            raise IsADirectoryError(errno.EISDIR, f"cairn://{info['name']}: is a directory")
        if "version" in info:
            return int((self._layout_of(info["model"]).record or {})["sha256"], 16)
        return int(hashlib.sha256(f"{info['model']}\0{info['tensor']}\0{info['created_ns']}".encode()).hexdigest(), 16)

    # ---- directories ----

    def mkdir(self, path: Any, create_parents: bool = True, **kwargs: Any) -> None:
        """Directories exist while files are below them: this only checks that no file is in the way."""
        key = self._key(path)
        parts = _split_key(key)
        if parts:
            prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
            hits = self._find_files({"in": prefixes})
            if hits:
                raise FileExistsError(errno.EEXIST, f"cairn://{min(hits, key=len)}: a file is in the way of "
                                                    f"directory {key!r}")

    def makedirs(self, path: Any, exist_ok: bool = False) -> None:
        key = self._key(path)
        if not exist_ok and key and self.isdir(key):
            raise FileExistsError(errno.EEXIST, f"cairn://{key}: the directory exists")
        self.mkdir(key)

    def rmdir(self, path: Any) -> None:
        """Refuses a directory that holds anything (OSError ENOTEMPTY) and a file; an empty directory
        does not exist apart from its files, so there is nothing else to remove."""
        key = self._key(path)
        if self._file(key) is not None:
            raise NotADirectoryError(errno.ENOTDIR, f"cairn://{key}: is a file")
        if self._has_files_below(key) or (key and self._foreign(key) is not None):
            raise OSError(errno.ENOTEMPTY, f"cairn://{key}: the directory is not empty")

    # ---- reading ----

    def _resolve(self, key: str) -> _Layout:
        """The layout of the file at ``key``: written through cairn://, or a model's tensor."""
        f = self._file(key)
        if f is not None:
            return self._layout_of(f.model)
        fm = self._foreign(key) if key else None
        if fm is not None and fm.rel in fm.tensors():
            name, nbytes = fm.tensors()[fm.rel]
            return _Layout(fm.model, [name], [0, nbytes], None, int(fm.shown.get("created_ns", 0)), self.client)
        if not key or self._has_files_below(key) or fm is not None and (not fm.rel or fm.rel in fm.dirs()):
            raise IsADirectoryError(errno.EISDIR, f"cairn://{key}: is a directory")
        raise FileNotFoundError(errno.ENOENT, f"cairn://{key}: no such file")

    def _read(self, layout: _Layout, start: int, end: int, group_bytes: int = 64 << 20) -> Iterator[memoryview]:
        """The bytes [start, end) of a stored file, in pieces: read-only views of the daemon's arena
        (no copy), each holding its tensor's lease while it is referenced. Reads only the tensors
        that overlap the range, about ``group_bytes`` per request."""
        if start >= end:
            return
        first = bisect.bisect_right(layout.offsets, start) - 1
        last = bisect.bisect_left(layout.offsets, end) - 1
        i = first
        while i <= last:
            group = [i]
            total = layout.offsets[i + 1] - layout.offsets[i]
            while group[-1] < last and total < group_bytes:
                group.append(group[-1] + 1)
                total += layout.offsets[group[-1] + 1] - layout.offsets[group[-1]]
            with _as_os_errors(layout.model):
                arrays = layout.client.load_model(layout.model, names=[layout.names[j] for j in group])
            for j in group:
                a = arrays.pop(layout.names[j])
                view = memoryview(a.reshape(-1).view(np.uint8)) if a.size else memoryview(b"")
                lo = max(start, layout.offsets[j]) - layout.offsets[j]
                hi = min(end, layout.offsets[j + 1]) - layout.offsets[j]
                yield view[lo:hi]
                del view, a
            del arrays
            i = group[-1] + 1

    @staticmethod
    def _verify(key: str, layout: _Layout, digest: str) -> None:
        assert layout.record is not None
        if digest != layout.record["sha256"]:
            raise OSError(errno.EIO, f"cairn://{key}: the bytes of model {layout.model!r} hash to sha256 {digest}, "
                                     f"not {layout.record['sha256']} as recorded; the model is damaged")

    def cat_file(self, path: Any, start: Optional[int] = None, end: Optional[int] = None, **kwargs: Any) -> bytes:
        """The file's bytes [start, end) (negative: from the end), reading only the pieces that
        overlap them. A whole-file read checks the file's SHA-256."""
        key = self._key(path)
        layout = self._resolve(key)
        size = layout.size
        s = 0 if start is None else (max(0, size + start) if start < 0 else min(start, size))
        e = size if end is None else (max(0, size + end) if end < 0 else min(end, size))
        if s >= e:
            return b""
        h = hashlib.sha256() if s == 0 and e == size and layout.record is not None else None
        data = _join(self._read(layout, s, e), e - s, h)
        if h is not None:
            self._verify(key, layout, h.hexdigest())
        return data

    def get_file(self, rpath: Any, lpath: Any, callback: Any = DEFAULT_CALLBACK, outfile: Any = None,
                 **kwargs: Any) -> None:
        """Copies a file to a local path (or ``outfile``), streaming its pieces; checks its SHA-256
        and removes a local file it wrote when the check fails. A directory becomes a local one."""
        from fsspec.implementations.local import LocalFileSystem  # noqa: PLC0415

        if outfile is None and isfilelike(lpath):
            outfile = lpath
        key = self._key(rpath)
        try:
            layout = self._resolve(key)
        except IsADirectoryError:
            if outfile is not None:
                raise
            os.makedirs(lpath, exist_ok=True)
            return None
        own = outfile is None
        if own:
            LocalFileSystem(auto_mkdir=True).makedirs(os.path.dirname(os.path.abspath(lpath)), exist_ok=True)
            outfile = open(lpath, "wb")  # noqa: SIM115 -- closed below
        ok = False
        try:
            callback.set_size(layout.size)
            h = hashlib.sha256()
            for v in self._read(layout, 0, layout.size):
                outfile.write(v)
                h.update(v)
                callback.relative_update(len(v))
            if layout.record is not None:
                self._verify(key, layout, h.hexdigest())
            ok = True
        finally:
            if own:
                outfile.close()
                if not ok:
                    with contextlib.suppress(OSError):
                        os.unlink(lpath)

    def _open(self, path: Any, mode: str = "rb", block_size: Any = None, autocommit: bool = True,
              cache_options: Any = None, **kwargs: Any) -> "CairnFile":
        if mode not in ("rb", "wb", "ab", "xb"):
            raise ValueError(f"cairn://: mode {mode!r} is not supported (rb, wb, ab, xb and their text forms are)")
        return CairnFile(self, path, mode, block_size=block_size, autocommit=autocommit,
                         cache_options=cache_options, **kwargs)

    # ---- writing ----

    def _write_options(self, options: Mapping[str, Any], where: str) -> Tuple[str, Optional[str], Dict[str, Any]]:
        """(durability, parent, metadata) of one write: the filesystem's, overridden by ``options``."""
        unknown = [k for k in options if k not in _WRITE_OPTIONS]
        if unknown:
            raise TypeError(f"{where}: unknown option {unknown[0]!r} (a write takes durability, parent, metadata)")
        durability = options.get("durability", self.durability)
        parent = options.get("parent", self.parent)
        metadata = options.get("metadata")
        _check_write_options(durability, parent, metadata, where)
        meta = dict(self.metadata)
        meta.update(metadata or {})
        return durability, parent, meta

    def _target(self, key: str) -> Optional[_FileEntry]:
        """The file a write to ``key`` replaces (None for a new path); refuses a path where the tree
        has no room for a file: a directory, below a file, or in a model's directory."""
        parts = _split_key(key)
        hits = self._find_files({"in": ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]})
        for i in range(1, len(parts)):
            above = "/".join(parts[:i])
            if above in hits:
                raise NotADirectoryError(errno.ENOTDIR, f"cairn://{key}: {above!r} is a file, not a directory")
        if key not in hits and self._has_files_below(key):
            raise IsADirectoryError(errno.EISDIR, f"cairn://{key}: is a directory")
        fm = self._foreign(key)
        if fm is not None and not fm.rel:
            raise IsADirectoryError(errno.EISDIR, f"cairn://{key}: is the directory of model {key!r}")
        if fm is not None:
            raise PermissionError(errno.EACCES, f"cairn://{key}: model {fm.model!r} was not written through cairn:// "
                                                f"and is read-only here (its tensors show as files); write elsewhere")
        return self._entry(key, hits[key]) if key in hits else None

    def _free_version(self, key: str, start: int) -> int:
        """A version >= ``start`` whose model id is free (removed ids stay taken until ``cairn gc``)."""
        v, step = start, 1
        while True:
            try:
                self.client.show(f"{key}{VERSION_MARK}{v}")
            except _errors.NotFound:
                return v
            v += step
            step *= 2

    def _commit(self, key: str, make: Callable[[str, Optional[str], Dict[str, Any]], None], *, exclusive: bool,
                parent: Optional[str]) -> str:
        """Commits the next version of the file at ``key`` with ``make(model id, parent, record
        fields)``, then retires the versions it replaces; returns the new model id."""
        for _ in range(8):
            cur = self._target(key)
            if exclusive and cur is not None:
                raise FileExistsError(errno.EEXIST, f"cairn://{key}: the file exists (mode 'x' / 'create')")
            created_ns = time.time_ns()
            if cur is not None:
                try:
                    created_ns = int((self._layout_of(cur.model).record or {})["created_ns"])
                except (OSError, KeyError, TypeError, ValueError):
                    pass  # a version without a usable record: the file starts again
            model = f"{key}{VERSION_MARK}{self._free_version(key, cur.version + 1 if cur else 1)}"
            try:
                make(model, parent if parent is not None else (cur.model if cur else None),
                     {"path": key, "created_ns": created_ns})
            except _errors.AlreadyExists:
                continue  # another writer took this version: look again
            except _errors.NotFound as e:
                raise _fs_error(e, key) from e
            for old in ([cur.model] + cur.older) if cur else []:
                with contextlib.suppress(_errors.NotFound):
                    self.client.remove(old)
            self.invalidate_cache(key)
            return model
        raise FileExistsError(errno.EEXIST, f"cairn://{key}: other writers kept taking the next version; try again")

    def _store(self, path: Any, data: Any, *, exclusive: bool = False, **options: Any) -> str:
        """Stores ``data`` (any bytes-like object) as the next version of the file at ``path``;
        returns the model id, once the write's durability is reached."""
        key = self._writable_key(path)
        durability, parent, meta = self._write_options(options, f"cairn://{key}")
        view = memoryview(data).cast("B") if len(memoryview(data)) else memoryview(b"")
        if parent is not None:
            try:
                self.client.show(parent)
            except _errors.NotFound:
                raise ValueError(f"cairn://{key}: parent={parent!r}: no such model") from None
        digest: List[str] = []
        hasher = threading.Thread(target=lambda: digest.append(hashlib.sha256(view).hexdigest()), daemon=True)
        hasher.start()  # hashlib lets go of the GIL: the hash runs beside the cutting
        try:
            layout, segments = file_segments(view)
        finally:
            hasher.join()
        arr = np.frombuffer(view, dtype=np.uint8) if len(view) else np.zeros(0, np.uint8)
        tensors = {name: arr[s:e] for name, s, e in segments}
        record = {"format": 1, "size": len(view), "sha256": digest[0], "layout": layout, "pieces": len(segments),
                  "records": sum(1 for n, _, _ in segments if "=" in n),
                  "cuts": {"min": MIN_PIECE, "avg": AVG_PIECE, "max": MAX_PIECE, "strict_bits": _STRICT_BITS,
                           "loose_bits": _LOOSE_BITS, "window": _WINDOW}}

        def make(model: str, par: Optional[str], fields: Dict[str, Any]) -> None:
            self.client.save_model(model, tensors, parent=par, arch=_FILE_ARCH,
                                   meta={**meta, RECORD_KEY: {**record, **fields}}, durability=durability, wait=True)

        try:
            return self._commit(key, make, exclusive=exclusive, parent=parent)
        finally:
            del tensors, arr

    def pipe_file(self, path: Any, value: Any, mode: str = "overwrite", **kwargs: Any) -> None:
        """Stores ``value`` (bytes-like) as the file at ``path``; ``mode="create"`` refuses an
        existing file (FileExistsError). ``kwargs``: durability, parent, metadata for this write."""
        if mode not in ("overwrite", "create"):
            raise ValueError(f"cairn://: pipe_file mode {mode!r} is not 'overwrite' or 'create'")
        self._store(path, value, exclusive=mode == "create", **kwargs)

    def put_file(self, lpath: Any, rpath: Any, callback: Any = DEFAULT_CALLBACK, mode: str = "overwrite",
                 **kwargs: Any) -> None:
        """Stores local file ``lpath`` at ``rpath`` (mapped, not read into memory first)."""
        if mode not in ("overwrite", "create"):
            raise ValueError(f"cairn://: put_file mode {mode!r} is not 'overwrite' or 'create'")
        if os.path.isdir(lpath):
            self.makedirs(rpath, exist_ok=True)
            return
        with open(lpath, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            callback.set_size(size)
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        try:
            self._store(rpath, mapped if mapped is not None else b"", exclusive=mode == "create", **kwargs)
        finally:
            if mapped is not None:
                with contextlib.suppress(BufferError):  # a view kept by a traceback: unmapped when collected
                    mapped.close()
        callback.relative_update(size)

    def cp_file(self, path1: Any, path2: Any, **kwargs: Any) -> None:
        """Copies a file without copying bytes: the copy is a new model whose parent is the source
        and which inherits all its tensors (and its metadata, with this write's merged over). A
        model's tensor copied this way becomes a file of its bytes. A directory is nothing to copy
        (directories are implied by their files)."""
        src = self._key(path1)
        dst = self._writable_key(path2)
        durability, _, meta = self._write_options(kwargs, f"cairn://{dst}")
        f = self._file(src)
        if f is None:
            layout = self._resolve(src) if self.info(src)["type"] == "file" else None
            if layout is None:
                self.mkdir(dst)
                return
            h = hashlib.sha256()
            for v in self._read(layout, 0, layout.size):
                h.update(v)
            source_meta: Dict[str, Any] = {}
            record = {"format": 1, "size": layout.size, "sha256": h.hexdigest(), "layout": "tensor", "pieces": 1,
                      "records": 0, "source": {"model": layout.model, "tensor": layout.names[0]}}
            inherit, inherit_all = layout.names, False
        else:
            layout = self._layout_of(f.model)
            with _as_os_errors(src):
                source_meta = dict(self.client.show(f.model).get("metadata") or {})
            record = dict(source_meta.pop(RECORD_KEY, None) or layout.record or {})
            inherit, inherit_all = [], True
        source_meta.update(meta)

        def make(model: str, par: Optional[str], fields: Dict[str, Any]) -> None:
            self.client.save_model(model, {}, parent=layout.model, arch=_FILE_ARCH,
                                   meta={**source_meta, RECORD_KEY: {**record, **fields}}, durability=durability,
                                   inherit=inherit, inherit_all=inherit_all, wait=True)

        self._commit(dst, make, exclusive=False, parent=layout.model)

    def mv(self, path1: Any, path2: Any, recursive: bool = False, maxdepth: Optional[int] = None,
           **kwargs: Any) -> None:
        """Moves files written through cairn://: a copy (no bytes copied; its parent is the source)
        then the source's removal (retired, as ``cairn rm``); not atomic. Refused (PermissionError)
        for a model not written through cairn:// and its tensors, before anything is moved: models
        are immutable."""
        for p in self.expand_path(path1, recursive=recursive, maxdepth=maxdepth):
            key = self._key(p)
            fm = self._foreign(key) if self._file(key) is None else None
            if fm is not None:
                raise PermissionError(errno.EACCES, f"cairn://{key}: model {fm.model!r} was not written through "
                                                    f"cairn://; it cannot be moved (models are immutable: copy it, "
                                                    f"then `cairn rm` the model)")
        super().mv(path1, path2, recursive=recursive, maxdepth=maxdepth, **kwargs)

    # ---- removing ----

    def _retire(self, f: _FileEntry) -> None:
        for mid in [f.model] + f.older:
            with contextlib.suppress(_errors.NotFound):
                self.client.remove(mid)
        self.invalidate_cache(f.path)

    def rm_file(self, path: Any) -> None:
        """Removes the file at ``path``: every live version of it is retired (``cairn rm``: readable
        by model id until ``cairn gc``)."""
        key = self._key(path)
        f = self._file(key)
        if f is None:
            info = self.info(key)
            if info["type"] == "directory":
                raise IsADirectoryError(errno.EISDIR, f"cairn://{key}: is a directory (use rm(path, recursive=True))")
            raise PermissionError(errno.EACCES, f"cairn://{key}: tensor {info['tensor']!r} of model {info['model']!r} "
                                                f"cannot be removed on its own (models are immutable); remove the "
                                                f"model's directory, or `cairn rm {info['model']}`")
        self._retire(f)

    def rm(self, path: Any, recursive: bool = False, maxdepth: Optional[int] = None) -> None:
        """Removes files, and with ``recursive`` directories: every file written through cairn://
        below them, and a model whose own directory is named (retired, as ``cairn rm``). Checks
        everything before removing anything: a model's tensor on its own (PermissionError) or a
        directory without ``recursive`` (IsADirectoryError) refuses the whole call."""
        files: List[_FileEntry] = []
        models: Set[str] = set()
        tensors: List[Tuple[str, str]] = []
        for p in self.expand_path(path, recursive=recursive, maxdepth=maxdepth):
            key = self._key(p)
            f = self._file(key)
            if f is not None:
                files.append(f)
                continue
            fm = self._foreign(key) if key else None
            if fm is not None and not fm.rel:
                if not recursive:
                    raise IsADirectoryError(errno.EISDIR, f"cairn://{key}: is the directory of model {key!r}; "
                                                          f"use rm(path, recursive=True)")
                models.add(fm.model)
            elif fm is not None:
                tensors.append((key, fm.model))
            elif not recursive and (not key or self._has_files_below(key)):
                raise IsADirectoryError(errno.EISDIR, f"cairn://{key}: is a directory; use rm(path, recursive=True)")
        for key, mid in tensors:
            if mid not in models:
                raise PermissionError(errno.EACCES, f"cairn://{key}: a tensor of model {mid!r} cannot be removed on "
                                                    f"its own (models are immutable); remove the model's directory")
        for f in files:
            self._retire(f)
        for mid in models:
            with contextlib.suppress(_errors.NotFound):
                self.client.remove(mid)
        self.invalidate_cache()
