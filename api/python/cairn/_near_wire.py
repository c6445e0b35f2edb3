"""The near-data worker's wire format (docs/near.md, "Wire format").

A frame is a 4-byte big-endian header length, the header (a UTF-8 JSON object), then exactly
``header["nbytes"]`` payload bytes (0 when the key is absent). Headers are at most 1 MiB and payloads
at most 16 GiB; anything else is rejected with a :class:`ProtocolError` naming what was wrong, before
any payload is read or allocated.
"""
from __future__ import annotations

import json
import socket
import struct
from typing import Any, Dict, Optional, Tuple

MAX_HEADER = 1 << 20
MAX_PAYLOAD = 16 << 30
_LEN = struct.Struct("!I")


class ProtocolError(Exception):
    """A frame that is not a valid near-data frame (the message says why)."""


def encode(header: Dict[str, Any], nbytes: int = 0) -> bytes:
    """The length and header of a frame whose payload has ``nbytes`` bytes (sent after it)."""
    h = dict(header)
    h["nbytes"] = int(nbytes)
    body = json.dumps(h, separators=(",", ":")).encode()
    if len(body) > MAX_HEADER:
        raise ProtocolError(f"header of {len(body)} bytes is over the limit of {MAX_HEADER}")
    return _LEN.pack(len(body)) + body


def send(sock: socket.socket, header: Dict[str, Any], *parts: Any) -> int:
    """Sends one frame whose payload is ``parts`` (bytes-like objects, e.g. contiguous numpy arrays)
    one after another. Returns the bytes sent."""
    views = [memoryview(p).cast("B") for p in parts]
    total = sum(v.nbytes for v in views)
    head = encode(header, total)
    if total < 65536:
        sock.sendall(b"".join([head] + [v.tobytes() for v in views]))
    else:
        sock.sendall(head)
        for v in views:
            if v.nbytes:
                sock.sendall(v)
    return len(head) + total


def decode_header(body: bytes) -> Dict[str, Any]:
    """The header of a frame from its JSON bytes; ProtocolError when it is not a JSON object with a
    valid ``nbytes``."""
    try:
        h = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ProtocolError(f"frame header is not UTF-8: {e}") from None
    except ValueError as e:
        raise ProtocolError(f"frame header is not JSON: {e}") from None
    if not isinstance(h, dict):
        raise ProtocolError(f"frame header is a JSON {type(h).__name__}, not an object")
    n = h.get("nbytes", 0)
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ProtocolError(f"frame header's nbytes is {n!r}, not a non-negative integer")
    if n > MAX_PAYLOAD:
        raise ProtocolError(f"frame payload of {n} bytes is over the limit of {MAX_PAYLOAD}")
    return h


def _read_exact(sock: socket.socket, n: int, into: Optional[memoryview] = None) -> memoryview:
    buf = into if into is not None else memoryview(bytearray(n))
    got = 0
    while got < n:
        k = sock.recv_into(buf[got:], n - got)
        if k == 0:
            raise ConnectionError(f"connection closed {got} bytes into a {n}-byte read")
        got += k
    return buf


def recv(sock: socket.socket) -> Tuple[Dict[str, Any], memoryview]:
    """Reads one frame: (header, payload). ConnectionError on EOF, ProtocolError on a bad frame."""
    (n,) = _LEN.unpack(_read_exact(sock, 4))
    if n == 0 or n > MAX_HEADER:
        raise ProtocolError(f"frame header length {n} is outside 1..{MAX_HEADER}")
    h = decode_header(bytes(_read_exact(sock, n)))
    payload = _read_exact(sock, h.get("nbytes", 0)) if h.get("nbytes", 0) else memoryview(b"")
    return h, payload


def parse(data: bytes) -> Tuple[Dict[str, Any], bytes, bytes]:
    """Parses one frame from the start of ``data``: (header, payload, rest). For tests and fuzzing;
    ProtocolError when the bytes are not a whole valid frame."""
    if len(data) < 4:
        raise ProtocolError(f"frame of {len(data)} bytes is shorter than its 4-byte length")
    (n,) = _LEN.unpack(data[:4])
    if n == 0 or n > MAX_HEADER:
        raise ProtocolError(f"frame header length {n} is outside 1..{MAX_HEADER}")
    if len(data) < 4 + n:
        raise ProtocolError(f"frame header of {n} bytes is cut off at {len(data) - 4}")
    h = decode_header(data[4:4 + n])
    k = h.get("nbytes", 0)
    if len(data) < 4 + n + k:
        raise ProtocolError(f"frame payload of {k} bytes is cut off at {len(data) - 4 - n}")
    return h, data[4 + n:4 + n + k], data[4 + n + k:]


def connect(address: str, timeout: Optional[float] = None) -> socket.socket:
    """A connection to a worker: a Unix socket path, or ``HOST:PORT`` over TCP (Nagle off)."""
    if "/" in address or ":" not in address:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        s.connect(address)
    else:
        host, port = address.rsplit(":", 1)
        s = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.settimeout(None)
    return s
