"""Argument checks and conversions of the client (client.py): names, JSON, timeouts, shapes,
durabilities, status codes, views of the arena, and the shutdown of a connection."""
from __future__ import annotations

import ctypes
import json
import math
import time
import warnings
from typing import Any, Deque, Iterator, Optional, Tuple

import numpy as np

from . import _errors, _ffi

_INT_MAX = 2**31 - 1


def _deprecated(old: str, new: str) -> None:
    """Warns that ``old`` (a name kept for one release) is deprecated, naming its replacement
    (docs/api.md); the warning points at the caller of ``old``."""
    warnings.warn(f"cairn: {old} is deprecated; use {new} (docs/api.md)", DeprecationWarning, stacklevel=3)


def _name(value: object, what: str) -> bytes:
    """A model id, tensor name or key as the C API wants it (UTF-8, no NUL)."""
    if not isinstance(value, str):
        raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                            f"invalid argument: {what} must be a str, not {type(value).__name__}")
    try:
        b = value.encode("utf-8")
    except UnicodeEncodeError:
        raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT", f"invalid argument: {what} {value!r} is not valid UTF-8") from None
    if b"\0" in b:
        raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT", f"invalid argument: {what} {value!r} contains a NUL character")
    return b


def _json(value: Any, what: str) -> bytes:
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT", f"invalid argument: {what} is not JSON-serializable: {e}") from None


def _timeout_ms(timeout: Optional[float]) -> int:
    """Seconds (None: forever) as the C API's milliseconds (-1: forever)."""
    if timeout is None or timeout == math.inf:
        return -1
    if timeout < 0 or math.isnan(timeout):
        raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT", f"invalid argument: timeout {timeout} must be >= 0 or None")
    return min(_INT_MAX, math.ceil(timeout * 1000))


# Long waits are split into slices of this many milliseconds, so that Ctrl-C (which Python handles
# only between C calls) and other threads sharing the client get a turn.
_SLICE_MS = 1000


def _slices(timeout_ms: int) -> Iterator[int]:
    """The successive timeouts (ms) of one wait of timeout_ms (-1: forever), the last one included."""
    if 0 <= timeout_ms <= _SLICE_MS:
        yield timeout_ms
        return
    deadline = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000
    while True:
        if deadline is None:
            yield _SLICE_MS
            continue
        left = math.ceil((deadline - time.monotonic()) * 1000)
        if left <= _SLICE_MS:
            yield max(0, left)
            return
        yield _SLICE_MS


def _shape_arg(shape: Tuple[int, ...]) -> "ctypes.Array[ctypes.c_int64]":
    return (ctypes.c_int64 * max(1, len(shape)))(*shape)


def _durability(durability: str) -> int:
    try:
        return _ffi.DURABILITY[durability]
    except (KeyError, TypeError):
        raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                            f"invalid argument: durability {durability!r} is not one of 'memory', 'local', 'global'") from None


def _check(status: int) -> None:
    if status != 0:
        raise _errors.last_error(status)


def _arena_array(addr: int, shape: Tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A writable array over ``addr`` (arena space handed out by cairn_model_add_tensor_space)."""
    n = math.prod(shape) * dtype.itemsize
    return np.frombuffer((ctypes.c_char * n).from_address(addr), np.uint8).view(dtype).reshape(shape)


# ---- the connection, shared by a Client, its tickets and the leases behind zero-copy arrays ----

def _shutdown(lib: ctypes.CDLL, handle: ctypes.c_void_p, pending: Deque[int]) -> None:
    while pending:
        lib.cairn_model_close(pending.popleft())
    if handle.value:
        lib.cairn_disconnect(handle)
        handle.value = None
