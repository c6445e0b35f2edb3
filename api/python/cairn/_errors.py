"""cairn's exceptions: one class per C status (include/cairn/status_codes.h)."""
from __future__ import annotations

from typing import Dict, Optional, Type

from . import _ffi


class CairnError(Exception):
    """A failed cairn call.

    Attributes:
        status: the C status name, e.g. ``"CAIRN_ERR_NOT_FOUND"``.
        code: its numeric value (``cairn_status``).
        message: what went wrong and what to do (``cairn_last_error()``), e.g.
            ``"not found: model 'm7' does not exist (see `cairn ls`)"``.
    """

    status: str
    code: int
    message: str

    def __init__(self, status: str, message: str, code: Optional[int] = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code if code is not None else _code_of(status)

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.status!r}, {self.message!r})"

    def __reduce__(self):
        # Pickled with its own fields (a process pool sends a worker's exception back to the caller).
        return (type(self), (self.status, self.message, self.code))


class NotFound(CairnError, LookupError):
    """CAIRN_ERR_NOT_FOUND: no such model, tensor, key or ticket."""


class AlreadyExists(CairnError):
    """CAIRN_ERR_EXISTS: the model id (or a tensor name in one model) is taken."""


class InvalidArgument(CairnError, ValueError):
    """CAIRN_ERR_INVALID_ARGUMENT: a bad name, dtype, shape, JSON document or option."""


class NoSpace(CairnError):
    """CAIRN_ERR_NO_SPACE: the DRAM arena (or the repository) cannot make room."""


class CorruptData(CairnError):
    """CAIRN_ERR_CORRUPTION: stored bytes do not match their hash."""


class IoError(CairnError):
    """CAIRN_ERR_IO: the daemon failed to read or write its repository."""


class Unavailable(CairnError):
    """CAIRN_ERR_UNAVAILABLE: no daemon listens on the socket, or the connection was lost."""


class Timeout(CairnError):
    """CAIRN_ERR_TIMEOUT: a wait ran out of time (the operation may still complete)."""


class PermissionDenied(CairnError):
    """CAIRN_ERR_PERMISSION: the daemon serves another uid."""


class Busy(CairnError):
    """CAIRN_ERR_BUSY: e.g. removing a model that is still being flushed or has descendants."""


class InternalError(CairnError):
    """CAIRN_ERR_INTERNAL: a broken invariant in cairn (please report it)."""


class ProtocolError(CairnError):
    """CAIRN_ERR_PROTOCOL: the client and the daemon do not understand each other."""


_BY_STATUS: Dict[str, Type[CairnError]] = {
    "CAIRN_ERR_NOT_FOUND": NotFound,
    "CAIRN_ERR_EXISTS": AlreadyExists,
    "CAIRN_ERR_INVALID_ARGUMENT": InvalidArgument,
    "CAIRN_ERR_NO_SPACE": NoSpace,
    "CAIRN_ERR_CORRUPTION": CorruptData,
    "CAIRN_ERR_IO": IoError,
    "CAIRN_ERR_UNAVAILABLE": Unavailable,
    "CAIRN_ERR_TIMEOUT": Timeout,
    "CAIRN_ERR_PERMISSION": PermissionDenied,
    "CAIRN_ERR_BUSY": Busy,
    "CAIRN_ERR_INTERNAL": InternalError,
    "CAIRN_ERR_PROTOCOL": ProtocolError,
}


def _code_of(status: str) -> int:
    """The value of the C status named ``status`` (-1 when the library is not loadable or does not
    know it: an error raised before the library could be found)."""
    try:
        names = _ffi.status_names()
    except _ffi.LibraryNotFound:
        return -1
    return names.index(status) if status in names else -1


def status_name(code: int) -> str:
    """The C name of status value ``code`` (``"CAIRN_STATUS_<n>"`` for one the library does not know)."""
    names = _ffi.status_names()
    if 0 <= code < len(names):
        return names[code]
    return f"CAIRN_STATUS_{code}"


def make_error(code: int, message: str) -> CairnError:
    """The exception for status ``code`` with ``message``."""
    name = status_name(code)
    return _BY_STATUS.get(name, CairnError)(name, message, code)


def error(status: str, message: str) -> CairnError:
    """The exception for the C status name ``status`` (errors detected in Python, before any C call)."""
    return _BY_STATUS.get(status, CairnError)(status, message)


def last_error(code: int) -> CairnError:
    """The exception for a C call that just returned ``code`` on this thread."""
    lib = _ffi.library()
    raw = lib.cairn_last_error()
    msg = raw.decode("utf-8", "replace") if raw else ""
    if not msg:
        s = lib.cairn_status_string(code)
        msg = s.decode("utf-8", "replace") if s else status_name(code)
    return make_error(code, msg)
