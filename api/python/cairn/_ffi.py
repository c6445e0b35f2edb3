"""ctypes declarations of libcairn's C API (include/cairn/cairn.h) and how the library is found.

The library is looked up, first match wins:

1. ``$CAIRN_LIBRARY`` -- an explicit path to ``libcairn.so`` (an error if it cannot be loaded);
2. an installed package (``cmake --install``, docs/install.md): the installed ``libcairn.so`` of the
   same tree, found relative to the package through ``_installed.py``, which the install writes;
3. the build tree this package sits in: ``<repo>/build/lib/libcairn.so`` when the package is
   imported from ``<repo>/api/python`` (``$CAIRN_BUILD_DIR/lib`` first, when set);
4. the dynamic loader: ``libcairn.so.0``, then ``libcairn.so`` (``LD_LIBRARY_PATH`` -- which
   ``eval "$(scripts/env)"`` sets -- ``ldconfig``'s cache, the default directories).

The enums below mirror cairn.h; their values are part of the C ABI (append-only).
"""
from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path
from typing import Dict, List, Optional, Tuple

class TensorIn(ctypes.Structure):
    """cairn_tensor_in (cairn.h): one tensor of cairn_model_add_tensors."""

    _fields_ = [("name", ctypes.c_char_p), ("data", ctypes.c_void_p), ("dtype", ctypes.c_int),
                ("ndim", ctypes.c_int), ("shape", ctypes.POINTER(ctypes.c_int64))]


class ReadOptions(ctypes.Structure):
    """cairn_read_options (cairn.h): how cairn_model_read and cairn_model_map deliver tensors."""

    _fields_ = [("size", ctypes.c_size_t), ("kind", ctypes.c_int), ("device", ctypes.c_int),
                ("private_copy", ctypes.c_int)]


class CommitOptions(ctypes.Structure):
    """cairn_commit_options (cairn.h): how cairn_model_commit_opts commits."""

    _fields_ = [("size", ctypes.c_size_t), ("durability", ctypes.c_int), ("wait", ctypes.c_int),
                ("pipelined", ctypes.c_int)]


class PrefetchOptions(ctypes.Structure):
    """cairn_prefetch_options (cairn.h): what cairn_model_prefetch stages, and where."""

    _fields_ = [("size", ctypes.c_size_t), ("kind", ctypes.c_int), ("device", ctypes.c_int), ("all", ctypes.c_int),
                ("timeout_ms", ctypes.c_int), ("progress_id", ctypes.c_char_p)]


def read_options(**fields: int) -> ReadOptions:
    """A cairn_read_options with the library's defaults (cairn_read_options_init), then ``fields``."""
    o = ReadOptions()
    library().cairn_read_options_init(ctypes.byref(o))
    for k, v in fields.items():
        setattr(o, k, v)
    return o


def commit_options(**fields: int) -> CommitOptions:
    """A cairn_commit_options with the library's defaults, then ``fields``."""
    o = CommitOptions()
    library().cairn_commit_options_init(ctypes.byref(o))
    for k, v in fields.items():
        setattr(o, k, v)
    return o


_COMMIT_OPTIONS: Dict[Tuple[int, int, int], CommitOptions] = {}


def commit_options_for(durability: int, wait: int, pipelined: int) -> CommitOptions:
    """The cairn_commit_options of one (durability, wait, pipelined) choice, made once and shared:
    the library only reads the struct, and a commit is the hot call of a checkpoint loop."""
    key = (durability, wait, pipelined)
    o = _COMMIT_OPTIONS.get(key)
    if o is None:
        o = _COMMIT_OPTIONS[key] = commit_options(durability=durability, wait=wait, pipelined=pipelined)
    return o


def prefetch_options(**fields: int) -> PrefetchOptions:
    """A cairn_prefetch_options with the library's defaults, then ``fields``."""
    o = PrefetchOptions()
    library().cairn_prefetch_options_init(ctypes.byref(o))
    for k, v in fields.items():
        setattr(o, k, v)
    return o


# ---- enums (values are the ABI of cairn.h) ----

#: cairn_dtype names, by value (the safetensors dtypes, in cairn.h's order).
DTYPE_NAMES: List[str] = [
    "F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2",
    "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL",
]

DURABILITY = {"memory": 0, "local": 1, "global": 2}
MEM_HOST = 0
MEM_CUDA = 1
MAX_DIMS = 8

_c_void_p_p = ctypes.POINTER(ctypes.c_void_p)
#: cairn_alloc_fn: (ctx, dtype, ndim, shape, nbytes) -> buffer
ALLOC_FN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                            ctypes.POINTER(ctypes.c_int64), ctypes.c_size_t)
_i64_p = ctypes.POINTER(ctypes.c_int64)


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Sets argtypes/restype of every function of cairn.h used here."""
    c_int, c_size_t, c_char_p, c_void_p = ctypes.c_int, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p
    st = ctypes.c_int  # cairn_status
    decl = {
        "cairn_read_options_init": (None, [ctypes.POINTER(ReadOptions)]),
        "cairn_commit_options_init": (None, [ctypes.POINTER(CommitOptions)]),
        "cairn_prefetch_options_init": (None, [ctypes.POINTER(PrefetchOptions)]),
        "cairn_tensor_put": (st, [c_void_p, c_char_p, c_void_p, c_int, c_int, _i64_p]),
        "cairn_tensor_info": (st, [c_void_p, c_char_p, ctypes.POINTER(c_int), ctypes.POINTER(c_int), _i64_p,
                                   ctypes.POINTER(c_size_t)]),
        "cairn_tensor_unpack": (st, [c_void_p, c_char_p, c_void_p, c_size_t]),
        "cairn_tensor_unpack_alloc": (st, [c_void_p, c_char_p, ALLOC_FN, c_void_p]),
        "cairn_tensor_poll": (st, [c_void_p, c_char_p, c_int, ctypes.POINTER(c_int)]),
        "cairn_tensor_delete": (st, [c_void_p, c_char_p]),
        "cairn_model_commit_opts": (st, [c_void_p, ctypes.POINTER(CommitOptions), _c_void_p_p]),
        "cairn_model_read": (st, [c_void_p, c_size_t, ctypes.POINTER(c_char_p), ctypes.POINTER(c_void_p),
                                  ctypes.POINTER(c_size_t), ctypes.POINTER(ReadOptions)]),
        "cairn_model_map": (st, [c_void_p, c_size_t, ctypes.POINTER(c_char_p), _c_void_p_p, ctypes.POINTER(c_size_t),
                                 ctypes.POINTER(ReadOptions)]),
        "cairn_model_prefetch": (st, [c_void_p, c_char_p, ctypes.POINTER(PrefetchOptions), _c_void_p_p]),
        "cairn_ticket_wait": (st, [c_void_p, c_int]),
        "cairn_status_string": (c_char_p, [c_int]),
        "cairn_status_name": (c_char_p, [c_int]),
        "cairn_library_has_cuda": (c_int, []),
        "cairn_last_error": (c_char_p, []),
        "cairn_connect": (st, [c_char_p, _c_void_p_p]),
        "cairn_disconnect": (None, [c_void_p]),
        "cairn_client_address": (c_char_p, [c_void_p]),
        "cairn_put_tensor": (st, [c_void_p, c_char_p, c_void_p, c_int, c_int, _i64_p]),
        "cairn_get_tensor_info": (st, [c_void_p, c_char_p, ctypes.POINTER(c_int), ctypes.POINTER(c_int),
                                       _i64_p, ctypes.POINTER(c_size_t)]),
        "cairn_unpack_tensor": (st, [c_void_p, c_char_p, c_void_p, c_size_t]),
        "cairn_unpack_tensor_alloc": (st, [c_void_p, c_char_p, ALLOC_FN, c_void_p]),
        "cairn_poll_tensor": (st, [c_void_p, c_char_p, c_int, ctypes.POINTER(c_int)]),
        "cairn_delete_tensor": (st, [c_void_p, c_char_p]),
        "cairn_model_create": (st, [c_void_p, c_char_p, c_char_p, _c_void_p_p]),
        "cairn_model_create_part": (st, [c_void_p, c_char_p, c_char_p, c_int, c_int, c_int, _c_void_p_p]),
        "cairn_model_add_tensor": (st, [c_void_p, c_char_p, c_void_p, c_int, c_int, _i64_p]),
        "cairn_model_add_tensors": (st, [c_void_p, ctypes.POINTER(TensorIn), c_size_t]),
        "cairn_model_add_tensor_space": (st, [c_void_p, c_char_p, c_int, c_int, _i64_p, _c_void_p_p]),
        "cairn_model_add_tensor_device": (st, [c_void_p, c_char_p, c_void_p, c_int, c_int, _i64_p]),
        "cairn_model_seal_tensor": (st, [c_void_p, c_char_p]),
        "cairn_model_inherit_tensor": (st, [c_void_p, c_char_p]),
        "cairn_model_inherit_all": (st, [c_void_p]),
        "cairn_model_set_architecture": (st, [c_void_p, c_char_p]),
        "cairn_model_set_metadata": (st, [c_void_p, c_char_p]),
        "cairn_model_commit": (st, [c_void_p, c_int, _c_void_p_p]),
        "cairn_model_commit_pipelined": (st, [c_void_p, c_int, _c_void_p_p]),
        "cairn_model_reserve": (st, [c_void_p, c_size_t, ctypes.POINTER(c_size_t)]),
        "cairn_model_set_copy_threads": (st, [c_void_p, ctypes.c_uint]),
        "cairn_model_abort": (None, [c_void_p]),
        "cairn_wait": (st, [c_void_p, c_int]),
        "cairn_ticket_free": (None, [c_void_p]),
        "cairn_pipeline_flush": (st, [c_void_p]),
        "cairn_pipeline_in_flight": (c_size_t, [c_void_p]),
        "cairn_model_open": (st, [c_void_p, c_char_p, _c_void_p_p]),
        "cairn_model_tensor_count": (st, [c_void_p, ctypes.POINTER(c_size_t)]),
        "cairn_model_tensor_info": (st, [c_void_p, c_size_t, ctypes.POINTER(c_char_p), ctypes.POINTER(c_int),
                                         ctypes.POINTER(c_int), _i64_p, ctypes.POINTER(c_size_t)]),
        "cairn_model_read_tensor": (st, [c_void_p, c_char_p, c_void_p, c_size_t, c_int]),
        "cairn_model_map_tensor": (st, [c_void_p, c_char_p, _c_void_p_p, ctypes.POINTER(c_size_t)]),
        "cairn_model_map_tensor_device": (st, [c_void_p, c_char_p, c_int, _c_void_p_p, ctypes.POINTER(c_size_t)]),
        "cairn_model_map_tensors": (st, [c_void_p, c_size_t, ctypes.POINTER(c_char_p), _c_void_p_p,
                                         ctypes.POINTER(c_size_t)]),
        "cairn_model_map_tensors_private": (st, [c_void_p, c_size_t, ctypes.POINTER(c_char_p), _c_void_p_p,
                                                 ctypes.POINTER(c_size_t)]),
        "cairn_model_read_tensors": (st, [c_void_p, c_size_t, ctypes.POINTER(c_char_p), ctypes.POINTER(c_void_p),
                                          ctypes.POINTER(c_size_t)]),
        "cairn_model_map_tensors_device": (st, [c_void_p, c_size_t, ctypes.POINTER(c_char_p), ctypes.c_int,
                                                _c_void_p_p, ctypes.POINTER(c_size_t)]),
        "cairn_model_read_tensors_device": (st, [c_void_p, c_size_t, ctypes.POINTER(c_char_p),
                                                 ctypes.POINTER(c_void_p), ctypes.POINTER(c_size_t)]),
        "cairn_model_close": (None, [c_void_p]),
        "cairn_model_put_file": (st, [c_void_p, c_char_p, c_char_p, c_char_p, c_int, c_char_p]),
        "cairn_model_get_file": (st, [c_void_p, c_char_p, c_char_p]),
        "cairn_prefetch": (st, [c_void_p, c_char_p]),
        # result_json is malloc'ed by the library: received as a void* so that it can be freed.
        "cairn_query": (st, [c_void_p, c_char_p, _c_void_p_p]),
        "cairn_hint": (st, [c_void_p, c_char_p, _c_void_p_p]),
        "cairn_prefetch_all": (st, [c_void_p, c_char_p, _c_void_p_p]),
        "cairn_request": (st, [c_void_p, c_char_p, _c_void_p_p]),
        "cairn_free": (None, [c_void_p]),
    }
    for name, (restype, argtypes) in decl.items():
        fn = getattr(lib, name)  # AttributeError names a missing symbol: a libcairn from another release
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


def _candidates() -> List[str]:
    out: List[str] = []
    try:
        from ._installed import LIBDIR  # only in an installed copy of the package
    except ImportError:
        LIBDIR = None
    if LIBDIR is not None:
        libdir = os.path.normpath(Path(__file__).resolve().parent / LIBDIR)
        out += [os.path.join(libdir, "libcairn.so.0"), os.path.join(libdir, "libcairn.so")]
    build = os.environ.get("CAIRN_BUILD_DIR")
    if build:
        out.append(str(Path(build) / "lib" / "libcairn.so"))
    # api/python/cairn/_ffi.py -> the repository root is three levels up from this directory.
    root = Path(__file__).resolve().parents[3]
    out.append(str(root / "build" / "lib" / "libcairn.so"))
    return [p for p in out if os.path.exists(p)] + ["libcairn.so.0", "libcairn.so"]


_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[str] = None
_lock = threading.Lock()


class LibraryNotFound(ImportError):
    """libcairn.so could not be loaded (see the module docstring for where it is looked for)."""


def library() -> ctypes.CDLL:
    """The loaded, declared libcairn (loaded on first use)."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        explicit = os.environ.get("CAIRN_LIBRARY")
        tried: List[str] = []
        if explicit:
            try:
                lib = ctypes.CDLL(explicit)
            except OSError as e:
                raise LibraryNotFound(f"cannot load libcairn from CAIRN_LIBRARY={explicit}: {e}") from None
            _lib, _lib_path = _declare(lib), explicit
            return _lib
        for cand in _candidates():
            try:
                lib = ctypes.CDLL(cand)
            except OSError as e:
                tried.append(f"{cand} ({e})")
                continue
            _lib, _lib_path = _declare(lib), cand
            return _lib
        raise LibraryNotFound(
            "cannot find libcairn.so; tried " + "; ".join(tried)
            + ". Build it (scripts/build), run `eval \"$(scripts/env)\"`, or set CAIRN_LIBRARY to its path")


_status_names: Optional[List[str]] = None


def status_names() -> List[str]:
    """The C status names by value (``"CAIRN_OK"``, ``"CAIRN_ERR_NOT_FOUND"``, ...), as the loaded
    library reports them (``cairn_status_name``, made from include/cairn/status_codes.h when the
    library is built): the table cannot drift from the library it describes."""
    global _status_names
    if _status_names is None:
        lib = library()
        names: List[str] = []
        while True:
            raw = lib.cairn_status_name(len(names))
            if raw is None:
                break
            names.append(raw.decode("ascii"))
        _status_names = names
    return _status_names


def library_path() -> Optional[str]:
    """The path (or loader name) libcairn was loaded from, or None before the first load."""
    return _lib_path
