"""cairn.torch.load into a module (docs/python.md): load_state_dict's checks, the copy-on-write
views taken as the parameters' memory, and copy=True read straight into it."""
from __future__ import annotations

from typing import Dict, List, Mapping, Tuple

import numpy as np
import torch
from torch import nn

from . import _torch_dtypes as _td
from .client import Client


def check_state(module: nn.Module, own: Mapping[str, torch.Tensor], shapes: Mapping[str, Tuple[int, ...]],
                 strict: bool) -> None:
    """load_state_dict's checks and messages: missing and unexpected keys (strict), shapes."""
    missing = [k for k in own if k not in shapes]
    unexpected = [k for k in shapes if k not in own]
    errors = []
    if strict and unexpected:
        errors.append("Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in unexpected) + ". ")
    if strict and missing:
        errors.append("Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in missing) + ". ")
    for k, shape in shapes.items():
        cur = own.get(k)
        if cur is not None and tuple(cur.shape) != tuple(shape):
            errors.append(f"size mismatch for {k}: copying a param with shape {tuple(shape)} from checkpoint, "
                          f"the shape in current model is {tuple(cur.shape)}.")
    if errors:
        raise RuntimeError(f"Error(s) in loading state_dict for {type(module).__name__}:\n\t" + "\n\t".join(errors))


def assign_state(module: nn.Module, state: Dict[str, torch.Tensor], strict: bool) -> None:
    """load_state_dict without the copy: each parameter and buffer takes the loaded tensor's memory
    (``.data =``), so the module's weights are the copy-on-write views themselves. A tensor whose
    dtype or device differs from the module's is copied into it instead."""
    own = module.state_dict(keep_vars=True)
    check_state(module, own, {k: tuple(t.shape) for k, t in state.items()}, strict)
    with torch.no_grad():
        for k, t in state.items():
            cur = own.get(k)
            if cur is None:
                continue
            if cur.dtype == t.dtype and cur.device == t.device and not cur.is_sparse:
                cur.data = t
            else:
                cur.copy_(t)


def read_into_module(c: Client, id: str, module: nn.Module, strict: bool) -> None:
    """load(copy=True) into a module on the host: one copy, straight into the parameters' and
    buffers' own memory (cairn_model_read) where the dtype matches and the memory is
    contiguous; the rest through load_model(copy=True) and copy_."""
    stored = {t["name"]: t for t in c.show(id).get("tensors", [])}
    own = module.state_dict(keep_vars=True)
    check_state(module, own, {k: tuple(t.get("shape", ())) for k, t in stored.items()}, strict)
    direct: Dict[str, np.ndarray] = {}
    rest: List[str] = []
    for k, t in stored.items():
        cur = own.get(k)
        if cur is None:
            continue
        ok = cur.device.type == "cpu" and cur.is_contiguous() and cur.layout == torch.strided and not cur.is_quantized
        if ok and cur.dtype in _td.CAIRN_OF:
            arr, cname = _td.to_numpy(k, cur.detach())
            if cname == t["dtype"] and arr.flags.writeable:
                direct[k] = arr
                continue
        rest.append(k)
    if direct:
        c.read_into(id, direct)
    if rest:
        got = c.load_model(id, names=rest, copy=True)
        with torch.no_grad():
            for k in rest:
                own[k].copy_(_td.from_numpy(k, got[k], stored[k]["dtype"]))
