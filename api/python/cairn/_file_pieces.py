"""How a cairn:// file is cut into the tensors of its model (cairn.fsspec): content-defined pieces
(a gear hash with FastCDC's normalised cut test, so an insertion moves only the cuts near it), and a
``torch.save`` archive's storage records as tensors of their own, whose chunks match what
``cairn.torch.save`` stores for the same tensors."""
from __future__ import annotations

import io
import re
import struct
import zipfile
from typing import Any, List, Tuple, Union

import numpy as np

#: Content-defined pieces are at least this long (except a file's last piece)...
MIN_PIECE = 128 << 10
#: ...most end soon after this many bytes (FastCDC's normalised chunking: before it the cut test
#: passes with probability 2**-_STRICT_BITS, after it with 2**-_LOOSE_BITS; pieces average about
#: 600 KiB)...
AVG_PIECE = 512 << 10
#: ...and none is longer than this (a run of bytes without a cut, like one of zeros, is cut here).
MAX_PIECE = 2 << 20
_STRICT_BITS = 20
_LOOSE_BITS = 18
_WINDOW = 32  # the cut test at a position hashes the 32 bytes that end there



_SALT = np.uint64(0x243F6A8885A308D3)
_K = [np.uint64(k) for k in (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93)]
_SALT32, _K32 = np.uint32(0x243F6A88), np.uint32(0x9E3779B1)
# The test has two stages. The first, over every position, hashes the last 4 bytes and passes with
# probability 2**-8; the second, only where the first passed, hashes the whole 32-byte window and
# passes the loose test when the hash's top _LOOSE_BITS-8 bits are zero, the strict one (a subset)
# when its top _STRICT_BITS-8 bits are.
_FIRST_LIMIT = np.uint32(1 << 24)
_LOOSE_SHIFT = np.uint64(64 - (_LOOSE_BITS - 8))
_STRICT_SHIFT = np.uint64(64 - (_STRICT_BITS - 8))
_BLOCK = 4 << 20  # positions hashed per numpy pass


def _words(buf: np.ndarray) -> np.ndarray:
    """The little-endian uint64 that starts at each byte of ``buf`` (an unaligned, read-only view:
    element j is bytes j..j+7)."""
    return np.ndarray((len(buf) - 7,), dtype="<u8", buffer=buf, offset=0, strides=(1,))


def _cut_candidates(buf: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """End offsets e (a cut after byte e-1) where the 32 bytes ``buf[e-32:e]`` pass the loose cut
    test, ascending, and those that pass the strict one. Depend on those bytes only, never on where
    ``buf`` starts in a file."""
    n = len(buf)
    none = np.zeros(0, np.int64)
    if n < _WINDOW:
        return none, none
    words = _words(buf)
    last = n - 4  # the last position a 4-byte word starts at
    lane = np.empty(_BLOCK // 4 + 1, np.uint32)
    loose, strict = [], []
    for j0 in range(0, last + 1, _BLOCK):
        j1 = min(last + 1, j0 + _BLOCK)
        # The first stage over the 4-byte words starting at j0 <= j < j1, as 4 contiguous lanes
        # (j = r mod 4): numpy runs at full speed over contiguous arrays, not over overlapping views.
        passed = []
        for r in range(min(4, j1 - j0)):
            start = j0 + r
            m = (j1 - start + 3) // 4
            a = lane[:m]
            np.bitwise_xor(np.frombuffer(buf, dtype="<u4", count=m, offset=start), _SALT32, out=a)
            np.multiply(a, _K32, out=a)
            hit = np.flatnonzero(a < _FIRST_LIMIT)
            if len(hit):
                passed.append(hit * 4 + start)
        if not passed:
            continue
        j = np.sort(np.concatenate(passed))
        e = j[j >= _WINDOW - 4] + 4  # the word at j ends the window at e = j + 4
        # The second stage: the 32-byte window buf[e-32:e], as four 8-byte words.
        h = (words[e - 8] ^ _SALT) * _K[0]
        h ^= words[e - 16] * _K[1]
        h ^= words[e - 24] * _K[2]
        h ^= words[e - 32] * _K[3]
        h ^= h >> np.uint64(29)
        h *= _K[0]
        keep = (h >> _LOOSE_SHIFT) == 0
        loose.append(e[keep])
        strict.append(e[keep & ((h >> _STRICT_SHIFT) == 0)])
    return (np.concatenate(loose) if loose else none), (np.concatenate(strict) if strict else none)


def content_cuts(data: Union[bytes, bytearray, memoryview, np.ndarray]) -> List[int]:
    """The end offsets of the content-defined pieces of ``data`` (the last one is ``len(data)``;
    empty for empty data).

    After a cut, the next piece ends at the first position between :data:`MIN_PIECE` and
    :data:`AVG_PIECE` bytes on that passes the strict test (:func:`_cut_candidates`), else at the
    first between :data:`AVG_PIECE` and :data:`MAX_PIECE` bytes on that passes the loose one, else
    :data:`MAX_PIECE` bytes on; the last piece may be shorter. A cut depends only on the bytes
    since the previous one (and the 32 before each candidate), so equal bytes give equal cuts
    wherever they start: after an insertion or a deletion the cuts fall on the same content again
    within a piece or two."""
    buf = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.reshape(-1).view(np.uint8)
    n = len(buf)
    loose, strict = _cut_candidates(buf)
    cuts: List[int] = []
    last = 0
    while n - last > MIN_PIECE:
        k = int(np.searchsorted(strict, last + MIN_PIECE, side="left"))
        if k < len(strict) and strict[k] < last + AVG_PIECE:
            e = int(strict[k])
        else:
            k = int(np.searchsorted(loose, last + AVG_PIECE, side="left"))
            if k < len(loose) and loose[k] <= last + MAX_PIECE:
                e = int(loose[k])
            elif n - last > MAX_PIECE:
                e = last + MAX_PIECE
            else:
                break
        cuts.append(e)
        last = e
    if n > last:
        cuts.append(n)
    return cuts


class _ViewReader(io.RawIOBase):
    """A read-only, seekable file over a buffer, without copying it (for zipfile)."""

    def __init__(self, view: memoryview) -> None:
        self._view = view
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, b: Any) -> int:
        n = max(0, min(len(b), len(self._view) - self._pos))
        b[:n] = self._view[self._pos:self._pos + n]
        self._pos += n
        return n


_TORCH_RECORD = re.compile(r"[^/]+/data/[^/]+")


def _torch_records(view: memoryview) -> List[Tuple[str, int, int]]:
    """The storage records of a ``torch.save`` zip archive, as (entry name, start, end) in file
    order: uncompressed entries ``<archive>/data/<key>``, each a tensor storage's bytes. Empty when
    ``view`` is not such an archive (no ``<archive>/data.pkl``, or not a zip)."""
    if len(view) < 30 or bytes(view[:4]) != b"PK\x03\x04":
        return []
    try:
        with zipfile.ZipFile(_ViewReader(view)) as z:
            infos = z.infolist()
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, struct.error):
        return []
    if not any(i.filename.endswith("/data.pkl") and i.filename.count("/") == 1 for i in infos):
        return []
    records = []
    for i in infos:
        if i.compress_type != zipfile.ZIP_STORED or not _TORCH_RECORD.fullmatch(i.filename) or i.file_size == 0:
            continue
        h = i.header_offset
        if h + 30 > len(view):
            continue
        sig, name_len, extra_len = struct.unpack_from("<I22xHH", view, h)
        start = h + 30 + name_len + extra_len
        if sig != 0x04034B50 or start + i.file_size > len(view):
            continue
        records.append((i.filename, start, start + i.file_size))
    records.sort(key=lambda r: r[1])
    kept: List[Tuple[str, int, int]] = []
    for r in records:  # entries of a well-formed archive never overlap; skip any that would
        if not kept or r[1] >= kept[-1][2]:
            kept.append(r)
    return kept


def file_segments(data: Union[bytes, bytearray, memoryview]) -> Tuple[str, List[Tuple[str, int, int]]]:
    """How a file's bytes are stored: ``(layout, [(tensor name, start, end), ...])``.

    The segments cover ``data`` in order without gaps, so the file is their concatenation.
    ``layout`` is ``"torch-zip"`` (each storage record of a ``torch.save`` archive is one segment,
    named ``file.<i>=<entry>``; the bytes between records are cut by :func:`content_cuts`) or
    ``"content-defined"`` (only :func:`content_cuts`). Pieces are named ``file.<i>`` (``i`` zero
    padded to 6 digits, in file order)."""
    view = memoryview(data).cast("B") if not isinstance(data, memoryview) or data.format != "B" else data
    records = _torch_records(view)
    segments: List[Tuple[str, int, int]] = []

    def cut(start: int, end: int) -> None:
        prev = start
        for e in content_cuts(view[start:end]):
            segments.append((f"file.{len(segments):06d}", prev, start + e))
            prev = start + e

    pos = 0
    for entry, start, end in records:
        cut(pos, start)
        segments.append((f"file.{len(segments):06d}={entry}", start, end))
        pos = end
    cut(pos, len(view))
    return ("torch-zip" if records else "content-defined"), segments


