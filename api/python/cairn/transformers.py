"""Hugging Face ``transformers`` models in cairn: save and load pretrained models, tokenizers, and a
``Trainer`` callback that checkpoints into cairn.

``import cairn.transformers as ctf`` (needs torch and transformers; ``accelerate`` only for the
``Trainer``, ``device_map="auto"`` and a model spread over several devices)::

    import cairn.transformers as ctf
    from transformers import AutoModelForSequenceClassification, Trainer

    ctf.save_pretrained(base, "bert-base", tokenizer=tok)            # weights, config, tokenizer files
    ctf.save_pretrained(tuned, "bert-sst2", parent="bert-base")      # only the tensors that changed
    m = ctf.from_pretrained(AutoModelForSequenceClassification, "bert-sst2")       # zero-copy on the host
    m = ctf.from_pretrained(AutoModelForSequenceClassification, "bert-sst2", device_map="cuda")
    tok = ctf.load_tokenizer("bert-sst2")
    Trainer(..., callbacks=[ctf.CairnCallback("runs/sst2")])        # runs/sst2/checkpoint-<step>

What a stored model holds
    Tensors: the model's ``state_dict()`` (parameters and persistent buffers, by their state-dict
    names), less the names that are tied to a tensor stored under another name (an output
    embedding tied to the input one is stored once, as ``save_pretrained`` writes it to
    ``model.safetensors``); then, with a tokenizer, each file its ``save_pretrained`` writes as a
    ``U8`` tensor ``tokenizer/<file name>`` (the file's bytes). Metadata: the caller's, plus
    :data:`RECORD_KEY` holding ``format``, ``class`` (the model's class name), ``config`` (what
    ``config.json`` holds), ``generation_config`` (what ``generation_config.json`` holds, for a
    model that generates), ``tied`` (left-out name -> the stored name it is tied to), ``tokenizer``
    (the file names), ``dtype`` and ``transformers_version``. The architecture graph is
    :func:`cairn.torch.architecture` of the model.

Every function takes ``client=`` (a :class:`cairn.Client`); without it the process's shared client
(:func:`cairn.torch.default_client`) is used. An unreachable daemon is :class:`cairn.Unavailable`,
naming the socket. See docs/frameworks.md ("Hugging Face transformers").
"""
from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import re
import tempfile
import weakref
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple, Union

import torch
import transformers
from torch import nn
from transformers import GenerationConfig, PreTrainedModel, TrainerCallback

from . import _errors
from . import _torch_dtypes as _td
from . import torch as _ct
from .client import Client, Ticket, library_has_cuda

__all__ = ["save_pretrained", "from_pretrained", "load_tokenizer", "CairnCallback", "RECORD_KEY",
           "TOKENIZER_PREFIX"]

#: The metadata key of what :func:`save_pretrained` records besides the tensors.
RECORD_KEY = "cairn.transformers"
#: Tensors named ``TOKENIZER_PREFIX + file name`` hold the tokenizer's files.
TOKENIZER_PREFIX = "tokenizer/"
_FORMAT = 1

log = logging.getLogger(__name__)

DeviceMap = Union[str, int, torch.device, Mapping[str, Union[str, int, torch.device]], None]

# The model id each model was last loaded from or saved as (the parent CairnCallback starts from).
_origin: "weakref.WeakKeyDictionary[nn.Module, str]" = weakref.WeakKeyDictionary()


def _client(client: Optional[Client]) -> Client:
    return client if client is not None else _ct.default_client()


def _invalid(message: str) -> _errors.CairnError:
    return _errors.error("CAIRN_ERR_INVALID_ARGUMENT", f"invalid argument: {message}")


def _unwrap(model: Any) -> nn.Module:
    """The model inside DistributedDataParallel and similar wrappers (their ``module``)."""
    while not isinstance(model, PreTrainedModel) and isinstance(getattr(model, "module", None), nn.Module):
        model = model.module
    return model


# ---- save ----

def _is_tie_target(model: nn.Module) -> Any:
    """A test of whether a state-dict name is the target of a weight tie (the copy transformers
    re-ties on load rather than reads): ``all_tied_weights_keys``, or the ``_tied_weights_keys``
    patterns of transformers before 5."""
    mapping = getattr(model, "all_tied_weights_keys", None)
    if isinstance(mapping, Mapping):
        targets = set(mapping)
        return lambda name: name in targets
    patterns = []
    for prefix, m in model.named_modules():
        keys = getattr(m, "_tied_weights_keys", None) or ()
        patterns += [re.compile(f"{re.escape(prefix)}\\.{k}" if prefix else k) for k in keys]
    return lambda name: any(p.search(name) for p in patterns)


def _untied_state(model: nn.Module) -> Tuple[Dict[str, torch.Tensor], Dict[str, str]]:
    """The state dict to store: keys to ignore on save dropped, and of each group of names for the
    same tensor (same memory, shape, strides and dtype: tied weights) one name kept, a name that is
    not a tie target where there is one (the name transformers' ``save_pretrained`` keeps). Returns
    it and the names left out -> the name kept."""
    state = dict(model.state_dict())
    for key in getattr(model, "_keys_to_ignore_on_save", None) or ():
        state.pop(key, None)
    groups: Dict[Tuple[Any, ...], List[str]] = {}
    for name, t in state.items():
        if isinstance(t, torch.Tensor) and t.device.type != "meta" and t.numel():
            key = (t.device, t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)
            groups.setdefault(key, []).append(name)
    is_target = _is_tie_target(model)
    tied: Dict[str, str] = {}
    for names in groups.values():
        if len(names) > 1:
            keep = next((n for n in names if not is_target(n)), names[0])
            tied.update({n: keep for n in names if n != keep})
    return {n: t for n, t in state.items() if n not in tied}, tied


def _json_of(obj: Any, what: str) -> Dict[str, Any]:
    """A transformers config object as the JSON object its ``save_pretrained`` writes."""
    try:
        return json.loads(obj.to_json_string(use_diff=True))
    except (TypeError, ValueError) as e:
        raise _invalid(f"the model's {what} cannot be written as JSON: {e}") from None


def _tokenizer_files(tokenizer: Any) -> Dict[str, bytes]:
    """The files ``tokenizer.save_pretrained`` writes, by name relative to its directory."""
    if not callable(getattr(tokenizer, "save_pretrained", None)):
        raise _invalid(f"tokenizer= takes an object with save_pretrained (a tokenizer or processor), "
                       f"not a {type(tokenizer).__name__}")
    files: Dict[str, bytes] = {}
    with tempfile.TemporaryDirectory(prefix="cairn-tokenizer-") as tmp:
        tokenizer.save_pretrained(tmp)
        for root, _, names in os.walk(tmp):
            for n in sorted(names):
                path = os.path.join(root, n)
                with open(path, "rb") as f:
                    files[os.path.relpath(path, tmp).replace(os.sep, "/")] = f.read()
    return dict(sorted(files.items()))


def _dtype_name(model: nn.Module) -> Optional[str]:
    for p in model.parameters():
        if p.is_floating_point():
            return str(p.dtype).split(".")[-1]
    return None


def save_pretrained(
    model: nn.Module,
    id: str,
    parent: Optional[str] = None,
    durability: str = "global",
    client: Optional[Client] = None,
    tokenizer: Any = None,
    meta: Optional[Mapping[str, Any]] = None,
    *,
    arch: Optional[Mapping[str, Any]] = None,
    wait: bool = True,
) -> Ticket:
    """Stores a ``transformers`` model as cairn model ``id``: its weights (the state dict, tied
    tensors once), its config and generation config, and, with ``tokenizer`` (anything with
    ``save_pretrained``: a tokenizer, a processor), the files that tokenizer writes. The module's
    docstring gives the layout.

    ``parent``: the model it derives from (e.g. the base model of a fine-tune). Every tensor equal
    to the parent's tensor of the same name (dtype, shape and bytes), tokenizer files included, is
    inherited: no bytes are sent or stored again. ``meta``: more metadata (a JSON object, without
    the key :data:`RECORD_KEY`). ``arch``: the architecture graph (default:
    :func:`cairn.torch.architecture` of the model). ``durability`` and ``wait`` as in
    :func:`cairn.torch.save`: returns the commit's :class:`cairn.Ticket`, by default once
    ``durability`` is reached. AlreadyExists when ``id`` is taken, NotFound when ``parent`` is
    missing, Unavailable (naming the socket) when no daemon listens.
    """
    model = _unwrap(model)
    config = getattr(model, "config", None)
    if not isinstance(model, nn.Module) or config is None or not callable(getattr(config, "to_json_string", None)):
        raise _invalid(f"save_pretrained() takes a transformers model (an nn.Module with a config), "
                       f"not a {type(model).__name__}")
    if meta is not None and RECORD_KEY in meta:
        raise _invalid(f"meta must not hold the key {RECORD_KEY!r}: save_pretrained writes it")
    if any(hasattr(p, "ds_numel") for p in model.parameters()):
        raise _invalid("the model's parameters are partitioned by DeepSpeed ZeRO-3; save it with "
                       "cairn.deepspeed, or gather it first")
    c = _client(client)
    state, tied = _untied_state(model)
    on_meta = [n for n, t in state.items() if isinstance(t, torch.Tensor) and t.device.type == "meta"]
    if on_meta:
        raise _invalid(f"tensors {', '.join(on_meta[:5])}{' ...' if len(on_meta) > 5 else ''} are on the meta "
                       "device (not loaded, or offloaded to disk); load them first")
    record: Dict[str, Any] = {"format": _FORMAT, "class": type(model).__name__,
                              "config": _json_of(config, "config"),
                              "transformers_version": transformers.__version__}
    record["config"]["architectures"] = [type(model).__name__]
    dtype = _dtype_name(model)
    if dtype is not None:
        record["dtype"] = dtype
        record["config"]["dtype"] = dtype
    generation = getattr(model, "generation_config", None)
    can_generate = getattr(model, "can_generate", None)
    if generation is not None and callable(can_generate) and can_generate():
        record["generation_config"] = _json_of(generation, "generation config")
    if tied:
        record["tied"] = tied
    tensors: Dict[str, torch.Tensor] = dict(state)
    if tokenizer is not None:
        files = _tokenizer_files(tokenizer)
        record["tokenizer"] = list(files)
        for name, data in files.items():
            tensors[TOKENIZER_PREFIX + name] = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else \
                torch.empty(0, dtype=torch.uint8)
    if arch is None:
        arch = _ct.architecture(model)
    ticket = _ct.save(tensors, id, parent, {**dict(meta or {}), RECORD_KEY: record}, client=c, arch=arch,
                      durability=durability, wait=wait)
    _origin[model] = id
    return ticket


# ---- load ----

def _record(c: Client, id: str) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(model ``id``'s ``show`` answer, its :data:`RECORD_KEY` record or {})."""
    info = c.show(id)
    record = (info.get("metadata") or {}).get(RECORD_KEY)
    return info, record if isinstance(record, dict) else {}


def _is_concrete(cls: Any) -> bool:
    return isinstance(cls, type) and issubclass(cls, PreTrainedModel)


def _config(cls: Any, id: str, record: Mapping[str, Any], config: Any, overrides: Dict[str, Any]) -> Any:
    """The model's config: ``config`` when given, else the stored one with ``overrides`` applied
    (config attributes, as transformers' ``from_pretrained`` takes them)."""
    if config is not None:
        if overrides:
            raise TypeError(f"from_pretrained() got config= and config attributes {sorted(overrides)}; "
                            "set them on the config")
        return copy.deepcopy(config)  # building the model sets attributes of its config
    stored = record.get("config")
    if not isinstance(stored, dict):
        raise _invalid(f"model {id!r} holds no transformers config (no {RECORD_KEY!r} record in its metadata: "
                       "it was not stored by cairn.transformers.save_pretrained); pass config=")
    model_type = stored.get("model_type") or ""
    if _is_concrete(cls):
        config_class = cls.config_class
        mine = getattr(config_class, "model_type", "") or ""
        if mine and model_type and mine != model_type:
            raise _invalid(f"model {id!r} is a {model_type!r} model ({record.get('class')}); "
                           f"{cls.__name__} takes {mine!r} models")
    else:
        try:
            config_class = transformers.CONFIG_MAPPING[model_type]
        except KeyError:
            raise _invalid(f"model {id!r} has model_type {model_type!r}, which transformers "
                           f"{transformers.__version__} does not know (custom code is not stored)") from None
    cfg, unused = config_class.from_dict(dict(stored), return_unused_kwargs=True, **overrides)
    if unused:
        raise TypeError(f"from_pretrained() got unexpected keyword arguments {sorted(unused)} "
                        f"(neither loader options nor attributes of {config_class.__name__})")
    return cfg


def _torch_dtype(value: Any, record: Mapping[str, Any], config: Any) -> Optional[torch.dtype]:
    """The dtype to build the model in: ``value`` (a torch dtype or its name); None or ``"auto"``:
    the stored model's."""
    if value is None or value == "auto":
        value = record.get("dtype") or getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        if value is None:
            return None
    if isinstance(value, str):
        value = getattr(torch, value.replace("torch.", ""), None)
    if not isinstance(value, torch.dtype):
        raise _invalid(f"torch_dtype must be a torch.dtype, its name or 'auto', not {value!r}")
    return value


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Every parameter registered meanwhile is moved to the meta device (no memory, no
    initialisation cost); buffers stay where they are made, so those a state dict lacks
    (non-persistent ones: position ids, rotary frequencies) keep the values the model computed.
    Patches ``nn.Module.register_parameter`` meanwhile (as accelerate's ``init_empty_weights``)."""
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param: Optional[nn.Parameter]) -> None:
        original(module, name, param)
        p = module._parameters.get(name)
        if p is not None and p.device.type != "meta":
            extra = dict(vars(p))
            extra["requires_grad"] = p.requires_grad
            module._parameters[name] = type(p)(p.to("meta"), **extra)

    nn.Module.register_parameter = register  # type: ignore[assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[assignment]


def _no_init_weights() -> contextlib.AbstractContextManager:
    """transformers' own ``no_init_weights`` (the context its ``from_pretrained`` builds a model
    in): the class's ``init_weights`` and torch's ``nn.init`` functions do nothing meanwhile, so
    building a model whose parameters are then replaced by stored tensors costs no initialisation
    (on the meta device it still walks every parameter). A version without it builds as before."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:
        return contextlib.nullcontext()
    return no_init_weights()


def _as_device(value: Any, what: str) -> torch.device:
    try:
        d = torch.device(f"cuda:{value}" if isinstance(value, int) and not isinstance(value, bool) else value)
    except (RuntimeError, TypeError):
        raise _invalid(f"{what}: {value!r} is not a device") from None
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0)
    return d


def _device_map(model: nn.Module, device_map: DeviceMap, dtype: Optional[torch.dtype]) -> Dict[str, torch.device]:
    """``device_map`` as module name prefix -> device (``""``: the whole model)."""
    if device_map is None:
        return {"": torch.device("cpu")}
    if isinstance(device_map, str) and device_map in ("auto", "balanced", "balanced_low_0", "sequential"):
        try:
            from accelerate.utils import get_balanced_memory, get_max_memory, infer_auto_device_map
        except ImportError:
            raise _invalid(f"device_map={device_map!r} needs accelerate (pip install accelerate)") from None
        no_split = sorted(getattr(model, "_no_split_modules", None) or [])
        if device_map == "sequential":
            memory = get_max_memory(None)
        else:
            memory = get_balanced_memory(model, no_split_module_classes=no_split, dtype=dtype,
                                         low_zero=device_map == "balanced_low_0")
        device_map = infer_auto_device_map(model, max_memory=memory, no_split_module_classes=no_split, dtype=dtype)
    if not isinstance(device_map, Mapping):
        return {"": _as_device(device_map, "device_map")}
    out: Dict[str, torch.device] = {}
    for prefix, dev in device_map.items():
        if dev == "disk":
            raise _invalid(f"device_map puts {prefix!r} on disk; cairn.transformers loads into memory only "
                           "(give it CPU memory instead)")
        out[str(prefix)] = _as_device(dev, f"device_map[{prefix!r}]")
    return out


def _device_of(name: str, plan: Mapping[str, torch.device]) -> Optional[torch.device]:
    """The device of the longest prefix of tensor ``name`` in ``plan`` (None when none covers it)."""
    best: Optional[str] = None
    for prefix in plan:
        if prefix == "" or name == prefix or name.startswith(prefix + "."):
            if best is None or len(prefix) > len(best):
                best = prefix
    return None if best is None else plan[best]


def _names_in_model(model: nn.Module, stored: List[str], own: Mapping[str, Any]) -> Dict[str, str]:
    """Stored tensor name -> the model's name for it. As in transformers, a model stored without
    its head loads into a class with one (``embeddings.x`` -> ``bert.embeddings.x``, by the class's
    ``base_model_prefix``) and one stored with a head into the bare model (the other way round)."""
    prefix = getattr(model, "base_model_prefix", "") or ""
    lead = prefix + "."
    if prefix and not any(n in own for n in stored):
        if any(n.startswith(lead) for n in own) and not any(n.startswith(lead) for n in stored):
            return {n: lead + n for n in stored}
        if any(n.startswith(lead) for n in stored) and not any(n.startswith(lead) for n in own):
            return {n: n[len(lead):] if n.startswith(lead) else n for n in stored}
    return {n: n for n in stored}


def _owner(model: nn.Module, name: str) -> Tuple[nn.Module, str]:
    module_name, _, attr = name.rpartition(".")
    return (model.get_submodule(module_name) if module_name else model), attr


def _put(model: nn.Module, name: str, value: torch.Tensor) -> None:
    """Makes ``value`` the parameter or buffer ``name`` (a parameter keeps its requires_grad)."""
    module, attr = _owner(model, name)
    old = module._parameters.get(attr)
    if old is not None:
        module._parameters[attr] = nn.Parameter(value, requires_grad=old.requires_grad)
    else:
        module._buffers[attr] = value


def _read_tensors(c: Client, id: str, wanted: Dict[str, Tuple[torch.device, torch.dtype]],
                  infos: Mapping[str, Tuple[str, Tuple[int, ...]]]) -> Dict[str, torch.Tensor]:
    """Tensors of model ``id``, each on its device: on the host copy-on-write views of the daemon's
    arena (no copy), on a CUDA device read straight into new device memory with one request per
    device (through the host when torch or libcairn has no CUDA); then cast where the dtype differs."""
    out: Dict[str, torch.Tensor] = {}
    on_cuda: Dict[torch.device, List[str]] = {}
    on_host: List[str] = []
    direct = torch.cuda.is_available() and library_has_cuda()
    for name, (dev, _) in wanted.items():
        (on_cuda.setdefault(dev, []) if dev.type == "cuda" and direct else on_host).append(name)
    with c.model_open(id) as r:
        if on_host:
            views = r.map(on_host, writable=True)
            for name in on_host:
                out[name] = _td.from_numpy(name, views.pop(name), infos[name][0])
        for dev, names in on_cuda.items():
            targets = []
            for name in names:
                cdtype, shape = infos[name]
                t = torch.empty(shape, dtype=_td.torch_dtype(cdtype, f"tensor {name!r}"), device=dev)
                if t.numel():
                    targets.append((name, t.data_ptr(), t.numel() * t.element_size()))
                out[name] = t
            torch.cuda.current_stream(dev).synchronize()  # the library's copies run outside torch's streams
            r.read_device(targets)
    for name, (dev, dtype) in wanted.items():
        t = out[name]
        if t.device != dev or (t.dtype != dtype and t.is_floating_point() and dtype.is_floating_point):
            out[name] = t.to(device=dev, dtype=dtype if t.is_floating_point() and dtype.is_floating_point else None)
    return out


def from_pretrained(
    cls_or_auto: Any,
    id: str,
    device_map: DeviceMap = None,
    client: Optional[Client] = None,
    torch_dtype: Any = None,
    *,
    config: Any = None,
    strict: bool = True,
    attn_implementation: Optional[str] = None,
    dtype: Any = None,
    **config_kwargs: Any,
) -> nn.Module:
    """Model ``id`` (stored by :func:`save_pretrained`) as an instance of ``cls_or_auto``: a
    ``transformers`` model class (``BertForSequenceClassification``) or an Auto class
    (``AutoModelForSequenceClassification``, which picks the class for the stored config), in
    eval mode, like transformers' ``from_pretrained``.

    The config is the stored one (``config=`` replaces it; other keyword arguments set its
    attributes, as in transformers). The model is built with its parameters on the meta device
    (nothing allocated, nothing initialised), then each parameter and buffer becomes the stored
    tensor: on the host a copy-on-write view of the daemon's shared memory (no copy; a write, an
    optimizer step, copies only the pages it touches into this process and never changes the
    stored model; the tensors stay pinned in the daemon's memory while the model keeps them); on a
    CUDA device new device memory filled straight from the daemon (one request per device). Tied
    weights are tied again (``model.tie_weights()``).

    ``device_map``: None (the host), a device (``"cuda"``, ``"cuda:1"``, an int, a torch.device), a
    dict of module name prefix -> device (``""``: the rest; a model over several devices gets
    accelerate's dispatch hooks, as in transformers), or ``"auto"``/``"balanced"``/``"sequential"``
    (accelerate's placement; disk offload is refused). ``torch_dtype`` (or ``dtype``): build the
    model in this dtype and cast floating tensors stored in another (a copy); None or ``"auto"``:
    the stored dtype. ``strict``: a stored tensor the model lacks, a shape that differs or a
    parameter the store lacks (other than a tied one) raises InvalidArgument; with
    ``strict=False`` unknown tensors are ignored and missing ones initialised as the model's class
    initialises them (transformers' ``initialize_weights``).
    """
    c = _client(client)
    info, record = _record(c, id)
    if torch_dtype is not None and dtype is not None and torch_dtype != dtype:
        raise TypeError("from_pretrained() got both torch_dtype and dtype; pass one")
    cfg = _config(cls_or_auto, id, record, config, dict(config_kwargs))
    dt = _torch_dtype(torch_dtype if torch_dtype is not None else dtype, record, cfg)
    build_kwargs: Dict[str, Any] = {}
    if dt is not None:
        build_kwargs["dtype"] = dt
    if attn_implementation is not None:
        build_kwargs["attn_implementation"] = attn_implementation
    with _parameters_on_meta(), _no_init_weights():
        if _is_concrete(cls_or_auto):
            model = cls_or_auto._from_config(cfg, **build_kwargs)
        elif callable(getattr(cls_or_auto, "from_config", None)):
            model = cls_or_auto.from_config(cfg, **build_kwargs)
        else:
            raise TypeError(f"from_pretrained() takes a transformers model class or Auto class, not {cls_or_auto!r}")
    plan = _device_map(model, device_map, dt)

    infos = {t["name"]: (t["dtype"], tuple(t["shape"])) for t in info.get("tensors", [])
             if not t["name"].startswith(TOKENIZER_PREFIX)}
    own = model.state_dict(keep_vars=True)
    names = _names_in_model(model, list(infos), own)  # stored name -> the model's
    unexpected = [s for s, n in names.items() if n not in own]
    mismatched = [f"{n}: stored {infos[s][1]}, the model's {tuple(own[n].shape)}"
                  for s, n in names.items() if n in own and tuple(own[n].shape) != infos[s][1]]
    if mismatched:
        raise _invalid(f"model {id!r} does not fit {type(model).__name__}: shapes differ for " + "; ".join(mismatched))
    if strict and unexpected:
        raise _invalid(f"model {id!r} has tensors {type(model).__name__} lacks: {', '.join(unexpected)} "
                       "(load it with the class it was saved from, or pass strict=False to ignore them)")
    wanted: Dict[str, Tuple[torch.device, torch.dtype]] = {}
    for s, n in names.items():
        if n in own:
            dev = _device_of(n, plan)
            if dev is None:
                raise _invalid(f"device_map does not place {n!r} (add its module, or \"\" for the rest)")
            wanted[s] = (dev, own[n].dtype)
    loaded = {names[s]: t for s, t in _read_tensors(c, id, wanted, infos).items()}
    with torch.no_grad():
        for name, t in loaded.items():
            _put(model, name, t)
        model.tie_weights()
        buffers = {n for n, _ in model.named_buffers()}
        missing = [n for n, t in model.state_dict(keep_vars=True).items()
                   if n not in loaded and (t.device.type == "meta" or n in buffers)]
        if missing and strict:
            raise _invalid(f"model {id!r} has no tensor for {', '.join(missing)} of {type(model).__name__} "
                           "(pass strict=False to initialise them as the class does)")
        _place_the_rest(model, plan, missing, set(loaded))
    if missing:
        _initialize(model, set(loaded))
    generation = record.get("generation_config")
    if isinstance(generation, dict) and getattr(model, "generation_config", None) is not None:
        model.generation_config = GenerationConfig.from_dict(generation)
    cfg.name_or_path = id
    if device_map is not None:
        model.hf_device_map = {k: str(v) for k, v in plan.items()}
        if len(set(plan.values())) > 1:
            _dispatch(model, plan)
    model.eval()
    _origin[model] = id
    return model


def _place_the_rest(model: nn.Module, plan: Mapping[str, torch.device], missing: List[str], loaded: set) -> None:
    """Parameters the store lacked as new memory on their device (initialised later); buffers it
    did not hold (non-persistent ones, missing ones) moved to their module's device."""
    params = _parameter_names(model)
    for name in missing:
        t = model.get_parameter(name) if name in params else None
        if t is not None and t.device.type == "meta":
            _put(model, name, torch.empty_like(t, device=_device_of(name, plan) or torch.device("cpu")))
    for name, b in model.named_buffers():
        if name in loaded or b is None:
            continue
        dev = _device_of(name, plan) or torch.device("cpu")
        if b.device != dev:
            _put(model, name, b.to(dev))


def _parameter_names(model: nn.Module) -> set:
    return {n for n, _ in model.named_parameters(remove_duplicate=False)}


def _initialize(model: nn.Module, loaded: set) -> None:
    """Initialises what the store lacked as the model's class does: transformers'
    ``initialize_weights`` skips the tensors marked as loaded."""
    state = model.state_dict(keep_vars=True)
    for name in loaded:
        state[name]._is_hf_initialized = True
    for m in model.modules():  # building the model marked every module initialised
        m.__dict__.pop("_is_hf_initialized", None)
    if not hasattr(model, "initialize_weights"):
        raise _invalid(f"initialising the tensors the store lacks needs transformers 5 or later "
                       f"(this is {transformers.__version__}); load with strict=True")
    model.initialize_weights()
    model.tie_weights()


def _dispatch(model: nn.Module, plan: Mapping[str, torch.device]) -> None:
    """accelerate's hooks that move activations between the devices of a model spread over several."""
    try:
        from accelerate import dispatch_model
    except ImportError:
        raise _invalid("a device_map over several devices needs accelerate (pip install accelerate)") from None
    dispatch_model(model, device_map={k: (v.index if v.type == "cuda" else str(v)) for k, v in plan.items()},
                   skip_keys=getattr(model, "_skip_keys_device_placement", None))


# ---- tokenizer ----

def load_tokenizer(id: str, cls: Any = None, *, client: Optional[Client] = None, **kwargs: Any) -> Any:
    """The tokenizer (or processor) stored with model ``id``: its files are written to a temporary
    directory, with the model's ``config.json``, and loaded with ``cls.from_pretrained`` (default
    ``transformers.AutoTokenizer``; ``AutoProcessor`` for a processor), ``kwargs`` passed on.
    NotFound when the model holds no tokenizer files."""
    c = _client(client)
    info, record = _record(c, id)
    names = record.get("tokenizer")
    if not names:
        raise _errors.error("CAIRN_ERR_NOT_FOUND",
                            f"not found: model {id!r} holds no tokenizer files (store them with "
                            "cairn.transformers.save_pretrained(..., tokenizer=tokenizer))")
    cls = cls if cls is not None else transformers.AutoTokenizer
    data = c.load_model(id, names=[TOKENIZER_PREFIX + n for n in names], copy=True)
    with tempfile.TemporaryDirectory(prefix="cairn-tokenizer-") as tmp:
        for n in names:
            path = os.path.join(tmp, *n.split("/"))
            if os.path.commonpath([tmp, os.path.abspath(path)]) != tmp:
                raise _errors.error("CAIRN_ERR_CORRUPTION",
                                    f"corrupt data: model {id!r}: tokenizer file name {n!r} leaves its directory")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data[TOKENIZER_PREFIX + n].tobytes())
        if isinstance(record.get("config"), dict) and "config.json" not in names:
            with open(os.path.join(tmp, "config.json"), "w") as f:
                json.dump(record["config"], f)
        tok = cls.from_pretrained(tmp, **kwargs)
    with contextlib.suppress(AttributeError, TypeError):
        tok.name_or_path = id
    return tok


# ---- Trainer ----

class CairnCallback(TrainerCallback):
    """A ``transformers.Trainer`` callback: each time the Trainer saves a checkpoint
    (``on_save``), the model goes to cairn as ``<prefix>/checkpoint-<global step>`` with
    :func:`save_pretrained`, derived from the previous one (so only the tensors that changed are
    stored: with frozen layers, only the trained ones). The first checkpoint derives from
    ``parent``, else from the id the model was loaded from with :func:`from_pretrained` (or last
    saved as), else from nothing; a resumed run (``resume_from_checkpoint``) continues from
    ``<prefix>/checkpoint-<step resumed at>`` when that exists.

    The Trainer's own checkpoint directory is written as before (it holds the optimizer, scheduler
    and RNG states that resuming needs). Only the main process saves. ``tokenizer=True`` also
    stores the Trainer's processing class (its files are inherited, not stored again, while they
    do not change). ``meta`` is added to each checkpoint's metadata, with ``step``, ``epoch`` and,
    when the Trainer tracks one, ``best_metric``. The daemon: ``client``, else the process's
    connection to ``socket`` (else ``$CAIRN_SOCKET``, else the default socket), made on first use.

    A failed save raises and stops training; :class:`cairn.Unavailable` (no daemon at the socket,
    or the connection lost) names the socket. With ``fallback=True`` an unreachable daemon is
    logged as a warning on the ``cairn.transformers`` logger instead, training goes on with the
    Trainer's own checkpoint for that step, and the next save tries the daemon again.
    :attr:`saved` lists the ids stored, oldest first.
    """

    def __init__(self, prefix: str, parent: Optional[str] = None, *,
                 socket: Optional[Union[str, "os.PathLike[str]"]] = None, client: Optional[Client] = None,
                 durability: str = "global", tokenizer: bool = True, meta: Optional[Mapping[str, Any]] = None,
                 fallback: bool = False) -> None:
        if not isinstance(prefix, str) or not prefix.strip("/"):
            raise _invalid(f"CairnCallback: prefix must be a non-empty str (model ids are <prefix>/checkpoint-<step>), "
                           f"not {prefix!r}")
        self.prefix = prefix.rstrip("/")
        self.parent = parent
        self.socket = socket
        self.durability = durability
        self.tokenizer = tokenizer
        self.meta = dict(meta or {})
        self.fallback = fallback
        self._client = client
        #: The checkpoint ids stored by this callback, oldest first.
        self.saved: List[str] = []
        self._last: Optional[str] = None

    def checkpoint_id(self, step: int) -> str:
        """The model id of the checkpoint at global step ``step``."""
        return f"{self.prefix}/checkpoint-{step}"

    @property
    def last_model(self) -> Optional[str]:
        """The model the next checkpoint derives from (None before the first save or resume)."""
        return self._last

    def client(self) -> Client:
        """The client the callback uses (connected on first use)."""
        if self._client is not None:
            return self._client
        from .dcp import _shared_client
        return _shared_client(self.socket)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._last is None and state.global_step and getattr(state, "is_world_process_zero", True):
            resumed = self.checkpoint_id(state.global_step)
            with contextlib.suppress(_errors.NotFound, _errors.Unavailable):
                self.client().show(resumed)
                self._last = resumed

    def on_save(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if not getattr(state, "is_world_process_zero", True) or model is None:
            return
        model = _unwrap(model)
        id = self.checkpoint_id(state.global_step)
        if id == self._last:
            return
        parent = self._last or self.parent or _origin.get(model)
        meta = {**self.meta, "step": int(state.global_step)}
        if state.epoch is not None:
            meta["epoch"] = float(state.epoch)
        if getattr(state, "best_metric", None) is not None:
            meta["best_metric"] = float(state.best_metric)
        tok = (kwargs.get("processing_class") or kwargs.get("tokenizer")) if self.tokenizer else None
        c: Optional[Client] = None
        try:
            c = self.client()
            save_pretrained(model, id, parent=parent, durability=self.durability, client=c, tokenizer=tok,
                            meta=meta)
        except _errors.Unavailable as e:
            if c is not None and c is not self._client:
                with contextlib.suppress(Exception):
                    c.close()  # a shared connection that broke: the next save connects again
            if not self.fallback:
                raise
            where = getattr(args, "output_dir", None) or "the Trainer's output_dir"
            log.warning("cairn: checkpoint %r was not stored (%s); the Trainer's own checkpoint in %s is",
                        id, e, where)
            return
        self._last = id
        self.saved.append(id)
