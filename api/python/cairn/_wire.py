"""A minimal client of cairnd's wire protocol (docs/protocol.md, version 1) for the catalog requests
that libcairn's C API does not offer (``list``, ``show``, ``stats``, ``remove``).

Only JSON-bodied requests without a blob are sent, and no ``hello`` (so no arena descriptor is
received): this connection never touches tensor data. It is a stopgap until the C API has a call
for these requests; everything else goes through libcairn.
"""
from __future__ import annotations

import json
import os
import socket
import struct
from typing import Any, Dict, Optional

from . import _errors

_HEADER = struct.Struct("<4sHHIIQ")  # magic, version, kind, json_len, flags, blob_len
_MAGIC = b"CRN1"
_VERSION = 1
_KIND_REQUEST, _KIND_RESPONSE = 1, 2
_MAX_JSON = 16 << 20
_MAX_BLOB = 256 << 20


def default_socket_path() -> str:
    """The address cairn_connect(NULL) uses: $CAIRN_SOCKET, else ${XDG_RUNTIME_DIR:-/tmp}/cairn-$UID/cairnd.sock."""
    s = os.environ.get("CAIRN_SOCKET")
    if s:
        return s
    base = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    return f"{base}/cairn-{os.getuid()}/cairnd.sock"


class WireConnection:
    """One Unix-socket connection to cairnd, strictly request -> response. Not thread-safe."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._sock: Optional[socket.socket] = None

    def _connect(self) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(self.address)
        except OSError as e:
            s.close()
            raise _errors.error(
                "CAIRN_ERR_UNAVAILABLE",
                f"daemon unavailable: no cairnd is listening on {self.address} ({e.strerror or e}); "
                "start one with `cairnd` or point CAIRN_SOCKET at a running daemon") from None
        return s

    def _recv_exact(self, n: int) -> bytes:
        assert self._sock is not None
        buf = bytearray()
        while len(buf) < n:
            part = self._sock.recv(min(n - len(buf), 1 << 20))
            if not part:
                raise EOFError
            buf += part
        return bytes(buf)

    def _lost(self, why: str) -> _errors.CairnError:
        self.close()
        return _errors.error("CAIRN_ERR_UNAVAILABLE",
                             f"daemon unavailable: lost the connection to cairnd on {self.address}: {why}")

    def _protocol(self, why: str) -> _errors.CairnError:
        self.close()
        return _errors.error("CAIRN_ERR_PROTOCOL", f"protocol error: cairnd on {self.address}: {why}")

    def call(self, request: Dict[str, Any]) -> Dict[str, Any]:
        """Sends ``request`` and returns the response's fields (without ``status``); a failed
        response raises the CairnError of its status."""
        if self._sock is None:
            self._sock = self._connect()
        body = json.dumps(request, separators=(",", ":")).encode()
        try:
            self._sock.sendall(_HEADER.pack(_MAGIC, _VERSION, _KIND_REQUEST, len(body), 0, 0) + body)
            header = self._recv_exact(_HEADER.size)
        except (OSError, EOFError) as e:
            raise self._lost(str(e) or "the daemon closed the connection") from None
        magic, version, kind, json_len, flags, blob_len = _HEADER.unpack(header)
        if magic != _MAGIC:
            raise self._protocol("bad magic in a response frame")
        if version != _VERSION:
            raise self._protocol(f"wire version {version}, this client speaks {_VERSION}; "
                                 "use a client and daemon from the same release")
        if kind != _KIND_RESPONSE or flags != 0 or not 0 < json_len <= _MAX_JSON or blob_len > _MAX_BLOB:
            raise self._protocol("malformed response frame header")
        try:
            text = self._recv_exact(json_len)
            if blob_len:
                self._recv_exact(blob_len)  # version 1 responses carry none; skip it
        except (OSError, EOFError) as e:
            raise self._lost(str(e) or "the daemon closed the connection inside a frame") from None
        try:
            resp = json.loads(text)
        except ValueError:
            raise self._protocol("a response body is not valid JSON") from None
        if not isinstance(resp, dict) or not isinstance(resp.get("status"), int):
            raise self._protocol("a response body has no integer 'status'")
        code = resp.pop("status")
        if code != 0:
            detail, text = resp.get("error", ""), _status_text(code)
            raise _errors.make_error(code, f"{text}: {detail}" if detail else text)
        return resp

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None


def _status_text(code: int) -> str:
    from . import _ffi
    s = _ffi.library().cairn_status_string(code)
    return s.decode("utf-8", "replace") if s else _errors.status_name(code)
