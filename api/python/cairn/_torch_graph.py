"""cairn.torch.architecture (docs/python.md, "Graphs"; docs/graph-format.md): the architecture
graph of an nn.Module, traced with torch.fx, or from its module order when it cannot be traced."""
from __future__ import annotations

import math
import operator
import warnings
from typing import Any, Dict, List, Mapping, Tuple

import torch
from torch import nn

# Attributes that say how a module runs, not what it is.
_IGNORED_ATTRS = {"training", "inplace"}
# Modules whose public attributes fix the shapes of their tensors (others get their shapes in the config).
_SHAPED_BY_CONFIG = {
    "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
    "Linear", "Bilinear", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm",
    "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "LayerNorm", "GroupNorm", "Embedding",
}


def _jsonable(v: Any) -> Any:
    """A stable JSON value for a config entry (never an address or an id)."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else repr(v)
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(v)
    if isinstance(v, slice):
        return {"slice": [_jsonable(v.start), _jsonable(v.stop), _jsonable(v.step)]}
    if v is Ellipsis:
        return "..."
    if isinstance(v, torch.Tensor):
        return {"tensor": list(v.shape), "dtype": str(v.dtype)}
    if callable(v):
        return f"{getattr(v, '__module__', '') or ''}.{getattr(v, '__qualname__', type(v).__name__)}"
    return type(v).__name__


def _is_simple(v: Any) -> bool:
    if v is None or isinstance(v, (bool, int, float, str)):
        return True
    return isinstance(v, (list, tuple)) and all(_is_simple(x) for x in v)


def _module_config(m: nn.Module) -> Dict[str, Any]:
    """The constructor-relevant configuration of a module: its public scalar attributes (for
    torch.nn's modules exactly their constructor arguments, e.g. Conv2d's channels, kernel_size,
    stride, padding, dilation, groups), whether it has a bias, and, for modules whose config does
    not fix their tensors' shapes, those shapes (and its extra_repr when nothing else describes it)."""
    cfg: Dict[str, Any] = {}
    for k, v in vars(m).items():
        if k.startswith("_") or k in _IGNORED_ATTRS or not _is_simple(v):
            continue
        cfg[k] = _jsonable(v)
    for k in getattr(type(m), "__constants__", ()) or ():
        if k not in cfg and k not in _IGNORED_ATTRS and _is_simple(getattr(m, k, None)):
            cfg[k] = _jsonable(getattr(m, k, None))
    described = bool(cfg) or bool(getattr(type(m), "__constants__", None))
    if "bias" in m._parameters and "bias" not in cfg and "affine" not in cfg and "elementwise_affine" not in cfg:
        cfg["bias"] = m._parameters["bias"] is not None
    if type(m).__name__ not in _SHAPED_BY_CONFIG:
        shapes = {n: list(t.shape) for n, t in m.state_dict().items() if isinstance(t, torch.Tensor)}
        if shapes:
            cfg["tensors"] = shapes
    if not described:  # e.g. a module of another library that keeps its settings elsewhere
        rep = m.extra_repr()
        if rep:
            cfg["repr"] = rep
    return cfg


def _fn_name(target: Any) -> str:
    if isinstance(target, str):
        return target
    return getattr(target, "__name__", None) or type(target).__name__


class _Builder:
    """Accumulates layers; names are unique, and names of modules are their qualified names."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.layers: List[Dict[str, Any]] = []
        self.used: set = set()
        self.module_layer: Dict[str, str] = {}  # qualified module name -> its (first) layer
        self.attr_layer: Dict[str, str] = {}    # get_attr target -> its layer
        self.reserved = {n for n, _ in module.named_modules() if n}

    def unique(self, base: str, reserved_ok: bool = False) -> str:
        name = base or "module"
        k = 0
        while name in self.used or (not reserved_ok and name in self.reserved):
            k += 1
            name = f"{base}#{k}"
        self.used.add(name)
        return name

    def add(self, name: str, type_: str, config: Dict[str, Any], inputs: List[str]) -> None:
        layer: Dict[str, Any] = {"name": name, "type": type_}
        if config:
            layer["config"] = config
        layer["inputs"] = inputs
        self.layers.append(layer)

    def graph(self) -> Tuple[Dict[str, Any], Dict[str, Dict[str, str]]]:
        """The graph (with explicit tensor entries only where the name-prefix rule would not find the
        layer) and, per layer, suffix -> state-dict key of the tensors it owns."""
        owned: Dict[str, Dict[str, str]] = {}
        explicit: Dict[str, str] = {}
        for key in self.module.state_dict().keys():
            layer, suffix = None, None
            parts = key.split(".")
            for i in range(len(parts) - 1, 0, -1):
                prefix = ".".join(parts[:i])
                if prefix in self.module_layer:
                    layer, suffix = self.module_layer[prefix], ".".join(parts[i:])
                    break
            if layer is None and key in self.attr_layer:
                layer, suffix = self.attr_layer[key], ""
            if layer is None:
                continue  # a tensor no layer uses (e.g. of a module the forward pass skips)
            owned.setdefault(layer, {})[suffix] = key
            by_rule = key.rsplit(".", 1)[0] if "." in key else key
            if by_rule != layer:
                explicit[key] = layer
        g: Dict[str, Any] = {"layers": self.layers}
        if explicit:
            g["tensors"] = explicit
        return g, owned


def _traced(module: nn.Module) -> Tuple[Dict[str, Any], Dict[str, Dict[str, str]]]:
    import torch.fx

    gm = torch.fx.symbolic_trace(module)
    b = _Builder(module)
    node_layer: Dict[Any, str] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]

    def config_args(node: Any, inputs: List[Any]) -> Dict[str, Any]:
        index = {n: i for i, n in enumerate(inputs)}

        def enc(v: Any) -> Any:
            if isinstance(v, torch.fx.Node):
                return f"${index[v]}"
            if isinstance(v, (list, tuple)):
                return [enc(x) for x in v]
            if isinstance(v, dict):
                return {str(k): enc(x) for k, x in v.items()}
            return _jsonable(v)

        cfg: Dict[str, Any] = {"args": enc(list(node.args))}
        if node.kwargs:
            cfg["kwargs"] = enc(dict(node.kwargs))
        return cfg

    for node in gm.graph.nodes:
        inputs = list(node.all_input_nodes)
        in_names = [node_layer[n] for n in inputs if n in node_layer]
        if node.op == "placeholder":
            i = placeholders.index(node)
            name = b.unique("input" if len(placeholders) == 1 else f"input:{node.target}")
            b.add(name, "Input", {"index": i}, [])
        elif node.op == "call_module":
            sub = gm.get_submodule(node.target) if hasattr(gm, "get_submodule") else dict(gm.named_modules())[node.target]
            first = node.target not in b.module_layer and node.target not in b.used
            name = b.unique(node.target, reserved_ok=first)
            if first:
                b.module_layer[node.target] = name
            b.add(name, type(sub).__name__, _module_config(sub), in_names)
        elif node.op in ("call_function", "call_method"):
            kind = "fn" if node.op == "call_function" else "method"
            name = b.unique(node.name)
            b.add(name, f"{kind}:{_fn_name(node.target)}", config_args(node, inputs), in_names)
        elif node.op == "get_attr":
            name = b.unique(node.target)
            b.attr_layer.setdefault(node.target, name)
            try:
                value = operator.attrgetter(node.target)(gm)
            except AttributeError:
                value = None
            cfg = {"shape": list(value.shape)} if isinstance(value, torch.Tensor) else {"value": _jsonable(value)}
            b.add(name, "Attr", cfg, [])
        else:
            continue  # output: not a layer
        node_layer[node] = name
    return b.graph()


def _module_order(module: nn.Module) -> Tuple[Dict[str, Any], Dict[str, Dict[str, str]]]:
    """The fallback graph: an input, then each leaf module (and each module holding tensors of its
    own) in registration order, each fed by the previous one."""
    b = _Builder(module)
    prev = b.unique("input")
    b.add(prev, "Input", {"index": 0}, [])
    for qual, m in module.named_modules():
        own = list(m._parameters) + list(m._buffers)
        if any(True for _ in m.children()) and not own:
            continue
        if qual == "" and not own:
            continue
        name = b.unique(qual or type(m).__name__, reserved_ok=True)
        b.module_layer[qual] = name
        if any(True for _ in m.children()):  # a container with tensors of its own: describe only those
            cfg = {"tensors": {n: list(t.shape) for n, t in list(m._parameters.items()) + list(m._buffers.items())
                               if t is not None}}
        else:
            cfg = _module_config(m)
        b.add(name, type(m).__name__, cfg, [prev])
        prev = name
    g, owned = b.graph()
    if "" in b.module_layer:  # the root's own tensors have no prefix: map them explicitly
        root = b.module_layer[""]
        for n in list(module._parameters) + list(module._buffers):
            if n in module.state_dict():
                g.setdefault("tensors", {})[n] = root
                owned.setdefault(root, {})[n] = n
    return g, owned


def _architecture(module: nn.Module) -> Tuple[Dict[str, Any], Dict[str, Dict[str, str]], bool]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            g, owned = _traced(module)
        return g, owned, True
    except Exception:  # torch.fx cannot trace data-dependent control flow, some builtins, ...
        g, owned = _module_order(module)
        return g, owned, False


def architecture(module: nn.Module) -> Dict[str, Any]:
    """The architecture graph of ``module`` (docs/graph-format.md), from torch.fx tracing where it
    works, else the chain of its leaf modules in registration order.

    One layer per call of a leaf module (named by its qualified name, so ``layer1.0.conv1.weight``
    belongs to layer ``layer1.0.conv1``; a module called again gets ``name#1``, ...), with its class
    name as ``type`` and its constructor configuration as ``config``; one per function or method
    call (``fn:add``, ``method:flatten``, config: the arguments, ``$i`` for the i-th input); one
    ``Input`` layer per forward argument; one ``Attr`` layer per tensor attribute read directly.
    Two modules built independently in the same way get the same graph, hence the same layer
    signatures.
    """
    return _architecture(module)[0]
