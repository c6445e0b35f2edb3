"""The file object of :class:`cairn.fsspec.CairnFileSystem` (internal to :mod:`cairn.fsspec`)."""
from __future__ import annotations

import contextlib
import errno
import hashlib
import io
from typing import TYPE_CHECKING, Any, Dict, Optional

from fsspec.spec import AbstractBufferedFile

from ._fsspec_records import _join, _Layout

if TYPE_CHECKING:
    from .fsspec import CairnFileSystem


class CairnFile(AbstractBufferedFile):
    """A file of :class:`CairnFileSystem`.

    Reading (``rb``): the version current when the file was opened, read piece by piece as fsspec's
    cache asks (random access reads only the pieces it needs).
    Writing (``wb``, ``xb``, ``ab``): the bytes are kept in memory and committed as one new version
    when the file is closed (inside ``fs.transaction``: when the transaction ends; dropped if it
    fails). ``xb`` refuses an existing file, at open and again at the commit. ``ab`` commits the
    current bytes followed by the new ones (the whole file is stored again; the repository keeps
    its unchanged pieces once). Keywords ``durability``, ``parent``, ``metadata`` set this write's
    options.
    """

    def __init__(self, fs: CairnFileSystem, path: Any, mode: str = "rb", block_size: Any = None,
                 autocommit: bool = True, cache_options: Any = None, **kwargs: Any) -> None:
        key = fs._key(path)
        self._options: Dict[str, Any] = {}
        self._layout: Optional[_Layout] = None
        self._base: Optional[_Layout] = None
        self._pending = False
        passthrough = {k: kwargs.pop(k) for k in ("cache_type",) if k in kwargs}
        kwargs.pop("size", None)  # the size is the model's
        if mode == "rb":
            if kwargs:
                raise TypeError(f"cairn://{key}: unknown option {next(iter(kwargs))!r} for reading")
            self._layout = fs._resolve(key)
            super().__init__(fs, key, mode, block_size=block_size or "default", autocommit=autocommit,
                             cache_options=cache_options, size=self._layout.size, **passthrough)
            return
        fs._writable_key(key)
        fs._write_options(kwargs, f"cairn://{key}")  # refuse bad options now, not at close
        self._options = kwargs
        cur = fs._target(key)
        if mode == "xb" and cur is not None:
            raise FileExistsError(errno.EEXIST, f"cairn://{key}: the file exists (mode 'x')")
        if mode == "ab" and cur is not None:
            self._base = fs._layout_of(cur.model)
        super().__init__(fs, key, mode, block_size=block_size or "default", autocommit=autocommit,
                         cache_options=cache_options, **passthrough)
        self.blocksize = 1 << 62  # nothing is sent before close: the commit is one model

    def _fetch_range(self, start: int, end: int) -> bytes:
        assert self._layout is not None
        end = min(end, self._layout.size)
        return _join(self.fs._read(self._layout, start, end), end - start)

    def _initiate_upload(self) -> None:
        pass

    def _upload_chunk(self, final: bool = False) -> bool:
        if not final:
            return False  # keep buffering: nothing is sent before close
        self._pending = True
        if self.autocommit:
            self.commit()
        return False  # the buffer stays until committed (a transaction commits later)

    def commit(self) -> None:
        """Commits the buffered bytes as the file's next version (at close, or when the
        transaction ends)."""
        if not self._pending:
            return
        self._pending = False
        fs: CairnFileSystem = self.fs
        buf = self.buffer.getbuffer()
        try:
            if self._base is not None:
                h = hashlib.sha256()
                old = bytearray()
                for v in fs._read(self._base, 0, self._base.size):
                    h.update(v)
                    old += v
                fs._verify(self.path, self._base, h.hexdigest())
                old += buf
                fs._store(self.path, old, **self._options)
            else:
                fs._store(self.path, buf, exclusive=self.mode == "xb", **self._options)
        finally:
            with contextlib.suppress(BufferError):
                buf.release()
            self.buffer = io.BytesIO()

    def discard(self) -> None:
        """Drops the buffered bytes (the transaction failed)."""
        self._pending = False
        self.buffer = io.BytesIO()
