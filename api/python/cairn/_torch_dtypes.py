"""torch dtypes <-> cairn dtypes <-> numpy: the one table the package converts tensors with.

| cairn | torch | numpy view of the bytes |
|-------|-------|-------------------------|
| F64 F32 F16 | float64 float32 float16 | float64 float32 float16 |
| BF16 | bfloat16 | uint16 (raw bits) |
| F8_E4M3 F8_E5M2 | float8_e4m3fn float8_e5m2 (torch >= 2.1) | uint8 (raw bits) |
| I64 I32 I16 I8 U8 BOOL | int64 int32 int16 int8 uint8 bool | the same |
| U16 U32 U64 | uint16 uint32 uint64 (torch >= 2.3) | the same |

Imported by the modules that use torch (``cairn.torch``, ``cairn.io``, the framework doors); the
rest of the package does not need torch.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch

from . import _errors


def _opt(name: str) -> Optional[torch.dtype]:
    return getattr(torch, name, None)


# cairn dtype -> (torch dtype or None where this torch lacks it, the same-size torch int type the
# raw numpy bits are viewed as, or None when numpy has the type itself)
TORCH_OF: Dict[str, Tuple[Optional[torch.dtype], Optional[torch.dtype]]] = {
    "F64": (torch.float64, None), "F32": (torch.float32, None), "F16": (torch.float16, None),
    "BF16": (torch.bfloat16, torch.int16),
    "F8_E4M3": (_opt("float8_e4m3fn"), torch.uint8), "F8_E5M2": (_opt("float8_e5m2"), torch.uint8),
    "I64": (torch.int64, None), "I32": (torch.int32, None), "I16": (torch.int16, None), "I8": (torch.int8, None),
    "U8": (torch.uint8, None), "BOOL": (torch.bool, None),
    "U16": (_opt("uint16"), None), "U32": (_opt("uint32"), None), "U64": (_opt("uint64"), None),
}
#: torch dtype -> cairn dtype, for every torch dtype cairn stores.
CAIRN_OF: Dict[torch.dtype, str] = {t: name for name, (t, _) in TORCH_OF.items() if t is not None}
# The torch types numpy lacks: torch dtype -> (same-size torch int type, numpy type of the raw bits).
_RAW: Dict[torch.dtype, Tuple[torch.dtype, np.dtype]] = {
    t: (raw, np.dtype("<u2") if raw == torch.int16 else np.dtype("u1"))
    for name, (t, raw) in TORCH_OF.items() if t is not None and raw is not None}
_NUMPY_SIGNED = {torch.int16: np.int16, torch.uint8: np.uint8}


def cairn_dtype(dtype: torch.dtype) -> Optional[str]:
    """The cairn dtype a tensor of torch ``dtype`` is stored as; None for one cairn does not store."""
    return CAIRN_OF.get(dtype)


def torch_dtype(cairn_name: str, what: str) -> torch.dtype:
    """The torch dtype of cairn dtype ``cairn_name``; InvalidArgument naming ``what`` when this
    torch has none."""
    t = TORCH_OF.get(cairn_name, (None, None))[0]
    if t is None:
        raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                            f"invalid argument: {what} is stored as {cairn_name}, which this torch "
                            f"({torch.__version__}) has no dtype for; read it with Client.load_model instead")
    return t


def to_numpy(name: str, value: Any) -> Tuple[np.ndarray, str]:
    """A tensor as a CPU numpy array over the same bytes (no copy for a CPU tensor; a GPU tensor is
    copied to the host) and the cairn dtype to store it as. BF16/FP8 come out as their raw bits.
    InvalidArgument, naming ``name``, for what cairn does not store (not a tensor, sparse,
    quantized, a dtype it lacks)."""
    if not isinstance(value, torch.Tensor):
        raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                            f"invalid argument: {name!r} is a {type(value).__name__}, not a tensor "
                            "(cairn stores tensors only)")
    t = value.detach()
    if t.layout != torch.strided or t.is_quantized:
        raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                            f"invalid argument: tensor {name!r} is {'quantized' if t.is_quantized else t.layout}; "
                            "cairn stores dense tensors (convert it first)")
    cname = CAIRN_OF.get(t.dtype)
    if cname is None:
        raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                            f"invalid argument: tensor {name!r} has dtype {t.dtype}, which cairn does not store "
                            "(IEEE floats, bfloat16, fp8, integers and bool)")
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.resolve_conj().resolve_neg()
    if t.dtype in _RAW:
        as_int, np_raw = _RAW[t.dtype]
        return t.view(as_int).numpy().view(np_raw), cname
    return t.numpy(), cname


def from_numpy(name: str, arr: np.ndarray, cairn_name: str) -> torch.Tensor:
    """A numpy array (as cairn returns tensors of ``cairn_name``) as a torch tensor over the same
    memory when it is C-contiguous (else over a contiguous copy), in its torch dtype."""
    want = torch_dtype(cairn_name, f"tensor {name!r}")
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr) if arr.ndim else arr.copy()
    raw = TORCH_OF[cairn_name][1]
    if raw is not None:
        return torch.from_numpy(arr.view(_NUMPY_SIGNED[raw])).view(want)
    return torch.from_numpy(arr)
