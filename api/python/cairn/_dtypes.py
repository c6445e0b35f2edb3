"""numpy dtypes <-> cairn dtypes (the safetensors dtypes).

| cairn     | numpy (what cairn returns)                          |
|-----------|-----------------------------------------------------|
| F64 F32 F16 | float64 float32 float16                           |
| I64 I32 I16 I8 | int64 int32 int16 int8                         |
| U64 U32 U16 U8 | uint64 uint32 uint16 uint8                     |
| BOOL      | bool                                                |
| BF16      | uint16 -- the raw bits (numpy has no bfloat16)      |
| F8_E4M3, F8_E5M2 | uint8 -- the raw bits                        |

Writing: arrays of the numpy types on the right are stored as the cairn type on the left; pass
``dtype="BF16"`` (or ``F8_E4M3`` / ``F8_E5M2``) to store raw uint16 / uint8 bits as those types.
Arrays of ml_dtypes' ``bfloat16``, ``float8_e4m3fn`` and ``float8_e5m2`` are recognised by their
dtype name (ml_dtypes is not needed by cairn itself).
"""
from __future__ import annotations

from typing import Dict, Tuple, Union

import numpy as np

from . import _errors, _ffi

#: The numpy dtype in which each cairn dtype comes back. BF16 and the FP8 types are raw bits.
NUMPY_DTYPES: Dict[str, np.dtype] = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"), "F8_E4M3": np.dtype("u1"), "F8_E5M2": np.dtype("u1"),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"), "U32": np.dtype("<u4"), "U16": np.dtype("<u2"), "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}

#: cairn dtypes that numpy cannot represent: they come back as these raw integer types.
RAW_DTYPES: Dict[str, np.dtype] = {"BF16": np.dtype("<u2"), "F8_E4M3": np.dtype("u1"), "F8_E5M2": np.dtype("u1")}

ITEMSIZE: Dict[str, int] = {name: dt.itemsize for name, dt in NUMPY_DTYPES.items()}

# ml_dtypes' names (also torch's spelling minus the prefix) for the types numpy lacks.
_BY_NUMPY_NAME = {"bfloat16": "BF16", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}
_BY_KIND = {("f", 8): "F64", ("f", 4): "F32", ("f", 2): "F16",
            ("i", 8): "I64", ("i", 4): "I32", ("i", 2): "I16", ("i", 1): "I8",
            ("u", 8): "U64", ("u", 4): "U32", ("u", 2): "U16", ("u", 1): "U8", ("b", 1): "BOOL"}

DTypeLike = Union[str, np.dtype, type, None]


def code(name: str) -> int:
    """The cairn_dtype value of a cairn dtype name."""
    return _ffi.DTYPE_NAMES.index(name)


def name_of_code(value: int) -> str:
    if 0 <= value < len(_ffi.DTYPE_NAMES):
        return _ffi.DTYPE_NAMES[value]
    raise _errors.error("CAIRN_ERR_PROTOCOL", f"the library reported an unknown dtype {value}")


def cairn_dtype(array_dtype: np.dtype, override: DTypeLike = None, what: str = "array") -> str:
    """The cairn dtype name to store an array of ``array_dtype`` as.

    ``override`` is a cairn name ("BF16") or a numpy dtype; a cairn name may reinterpret the bytes
    of an array of the same item size (raw uint16 bits stored as BF16)."""
    if override is not None:
        if isinstance(override, str) and override.upper() in ITEMSIZE:
            name = override.upper()
            if array_dtype.itemsize != ITEMSIZE[name]:
                raise _errors.error(
                    "CAIRN_ERR_INVALID_ARGUMENT",
                    f"invalid argument: {what}: dtype {name} needs {ITEMSIZE[name]}-byte items, the array has "
                    f"{array_dtype} ({array_dtype.itemsize} bytes)")
            return name
        try:
            wanted = np.dtype(override)
        except TypeError:
            raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                                f"invalid argument: {what}: unknown dtype {override!r} (use one of "
                                f"{', '.join(_ffi.DTYPE_NAMES)} or a numpy dtype)") from None
        if wanted != array_dtype:
            raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                                f"invalid argument: {what}: dtype={wanted} does not match the array's {array_dtype}; "
                                "convert the array with .astype() first")
    if array_dtype.name in _BY_NUMPY_NAME:
        return _BY_NUMPY_NAME[array_dtype.name]
    name = _BY_KIND.get((array_dtype.kind, array_dtype.itemsize))
    if name is None:
        raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                            f"invalid argument: {what}: numpy dtype {array_dtype} has no cairn equivalent "
                            f"(cairn stores {', '.join(_ffi.DTYPE_NAMES)})")
    return name


def prepare(array: object, override: DTypeLike = None, what: str = "array") -> Tuple[np.ndarray, str]:
    """``array`` as a C-contiguous, little-endian ndarray (copied only when needed) and its cairn dtype."""
    a = np.asarray(array)
    name = cairn_dtype(a.dtype, override, what)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    if not a.flags.c_contiguous:
        a = a.copy(order="C")  # np.ascontiguousarray would turn a 0-d array into a 1-d one
    return a, name


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype in which tensors of cairn dtype ``name`` are returned."""
    return NUMPY_DTYPES[name]
