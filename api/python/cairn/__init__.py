"""cairn -- a model cache for HPC deep-learning workflows, from Python.

A thin layer over libcairn's C API (ctypes) and numpy::

    import cairn, numpy as np

    with cairn.connect() as c:                      # $CAIRN_SOCKET, else the default socket
        t = c.save_model("base", {"fc.weight": np.ones((10, 4), np.float32)}, meta={"score": 0.9})
        t.wait()                                    # durable in the repository
        c.save_model("ft1", {"fc.bias": np.zeros(10, np.float32)}, parent="base",
                     inherit=["fc.weight"]).wait()  # fc.weight is shared, not stored again
        w = c.load_model("ft1")                     # read-only views of the daemon's shared memory

See docs/python.md. libcairn.so is found through $CAIRN_LIBRARY, the build tree this package sits
in, or the dynamic loader (cairn._ffi explains the order).
"""
from ._dtypes import NUMPY_DTYPES, RAW_DTYPES
from ._errors import (
    AlreadyExists,
    Busy,
    CairnError,
    CorruptData,
    InternalError,
    InvalidArgument,
    IoError,
    NoSpace,
    NotFound,
    PermissionDenied,
    ProtocolError,
    Timeout,
    Unavailable,
)
from ._ffi import DTYPE_NAMES as DTYPES
from ._ffi import LibraryNotFound
from .client import Client, DeviceArray, ModelReader, ModelWriter, Ticket, connect, library_has_cuda
from .io import export_file, import_file  # docs/import-export.md

__all__ = [
    "connect", "Client", "Ticket", "DeviceArray", "ModelReader", "ModelWriter", "library_has_cuda",
    "CairnError", "NotFound", "AlreadyExists", "InvalidArgument", "NoSpace", "CorruptData", "IoError",
    "Unavailable", "Timeout", "PermissionDenied", "Busy", "InternalError", "ProtocolError",
    "LibraryNotFound", "DTYPES", "NUMPY_DTYPES", "RAW_DTYPES", "import_file", "export_file",
]
