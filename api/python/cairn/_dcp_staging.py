"""Staging for :mod:`cairn.dcp`: a state dict walked into its tensors and rebuilt over staged
copies of them (DTensors and ShardedTensors over their staged local shards)."""
from __future__ import annotations

from typing import Any, List, Mapping, Tuple

import torch

from . import _torch_dtypes as _td

# Tensors up to this size are staged as private copies, not in arena space (they are sent inline
# with the commit: api/cpp/connection.hpp, kInlineLimit).
_INLINE_LIMIT = 64 * 1024


def _in_arena(t: torch.Tensor) -> bool:
    """Whether a tensor is staged in arena space (over 64 KiB, dense, of a dtype cairn stores)."""
    return (t.layout == torch.strided and not t.is_quantized and _td.cairn_dtype(t.dtype) is not None
            and t.numel() * t.element_size() > _INLINE_LIMIT)


class _Slot:
    """A tensor's place in the skeleton of a staged state dict."""
    __slots__ = ("path", "kind", "orig")

    def __init__(self, path: str, kind: str, orig: Any) -> None:
        self.path, self.kind, self.orig = path, kind, orig


def _collect(obj: Any, path: str, tensors: List[Tuple[str, torch.Tensor]]) -> Any:
    """The structure of ``obj`` with each tensor replaced by a _Slot; appends (path, local tensor)
    for each. Objects that are not containers or tensors are deep-copied (what DCP will pickle)."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch < 2.5
        from torch.distributed._tensor import DTensor  # type: ignore[no-redef]
    if isinstance(obj, DTensor):
        tensors.append((path, obj._local_tensor))
        return _Slot(path, "dtensor", obj)
    if isinstance(obj, ShardedTensor):
        for i, shard in enumerate(obj.local_shards()):
            offsets = "_".join(str(int(o)) for o in shard.metadata.shard_offsets)
            tensors.append((f"{path}@{offsets}", shard.tensor))
        return _Slot(path, "sharded", obj)
    if isinstance(obj, torch.Tensor):
        tensors.append((path, obj))
        return _Slot(path, "tensor", obj)
    if isinstance(obj, dict):
        return {k: _collect(v, f"{path}.{k}" if path else str(k), tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [_collect(v, f"{path}.{i}" if path else str(i), tensors) for i, v in enumerate(obj)]
        return tuple(items) if isinstance(obj, tuple) else items
    import copy
    return copy.deepcopy(obj)


def _stage_local(t: torch.Tensor, path: str, staged: Mapping[str, torch.Tensor]) -> torch.Tensor:
    got = staged.get(path)
    if got is not None:
        return got
    return t.detach().to("cpu", copy=True)  # small, or a dtype cairn lacks: a private copy


def _rebuild(obj: Any, staged: Mapping[str, torch.Tensor]) -> Any:
    if isinstance(obj, _Slot):
        if obj.kind == "tensor":
            return _stage_local(obj.orig, obj.path, staged)
        if obj.kind == "dtensor":
            try:
                from torch.distributed.tensor import DTensor
            except ImportError:  # torch < 2.5
                from torch.distributed._tensor import DTensor  # type: ignore[no-redef]
            local = _stage_local(obj.orig._local_tensor, obj.path, staged)
            return DTensor(local, obj.orig._spec, requires_grad=False)
        from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor
        shards = []
        for shard in obj.orig.local_shards():
            offsets = "_".join(str(int(o)) for o in shard.metadata.shard_offsets)
            shards.append(Shard(tensor=_stage_local(shard.tensor, f"{obj.path}@{offsets}", staged),
                                metadata=shard.metadata))
        return ShardedTensor._init_from_local_shards_and_global_metadata(
            shards, obj.orig.metadata(), process_group=obj.orig._process_group, init_rrefs=False)
    if isinstance(obj, dict):
        return {k: _rebuild(v, staged) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rebuild(v, staged) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_rebuild(v, staged) for v in obj)
    return obj
