"""Import and export of model files, the format taken from the file's extension (docs/import-export.md).

==========================  ==========================================================================
``.safetensors``            libcairn (``Client.model_put_file``/``model_get_file``: byte-exact, zero-copy)
``.h5`` / ``.hdf5``         libcairn_keras_h5 (cairn's HDF5 converter, built with HDF5; Keras 2 weight files, layout recorded)
``.pt`` / ``.pth`` / ``.bin``  here, with PyTorch: ``torch.load(weights_only=True)`` / ``torch.save``
==========================  ==========================================================================

::

    import cairn
    with cairn.connect() as c:
        cairn.import_file(c, "resnet18", "resnet18.pt")
        cairn.export_file(c, "resnet18", "copy.pt")      # torch.load gives the same tensors and dtypes

``python3 -m cairn.io import ID FILE [--parent P] [--meta JSON] [--durability D]`` and
``python3 -m cairn.io export ID FILE`` do the same from a shell (``cairn import`` runs this for
PyTorch files). Every format goes through libraries (libcairn, libcairn_keras_h5, PyTorch); this
module never runs the ``cairn`` tool.
"""
from __future__ import annotations

import collections
import ctypes
import json
import os
import sys
import threading
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np

from . import _errors, _ffi, _progress
from ._errors import CairnError

PathLike = Union[str, "os.PathLike[str]"]

__all__ = ["import_file", "export_file", "file_format"]

_FORMATS = {".safetensors": "safetensors", ".h5": "keras-h5", ".hdf5": "keras-h5",
            ".pt": "torch", ".pth": "torch", ".bin": "torch"}
# The metadata key recording what an import needs to write the file back.
RECORD_KEY = "cairn.import"

def _invalid(message: str) -> CairnError:
    return _errors.error("CAIRN_ERR_INVALID_ARGUMENT", "invalid argument: " + message)


def _one_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    first = text.splitlines()[0].strip()
    return first[:300] + ("..." if len(first) > 300 else "")


def file_format(path: PathLike) -> str:
    """``"safetensors"``, ``"keras-h5"`` or ``"torch"`` from the extension of ``path``; InvalidArgument otherwise."""
    p = os.fspath(path)
    ext = os.path.splitext(p)[1].lower()
    if ext not in _FORMATS:
        what = f"unknown extension {ext!r}" if ext else "no file extension"
        raise _invalid(f"'{p}': {what}; cairn reads and writes .safetensors, .h5/.hdf5 (Keras) or .pt/.pth/.bin (PyTorch)")
    return _FORMATS[ext]


# ---- Keras HDF5: libcairn_keras_h5.so ----

_KERAS_H5_LIB = "libcairn_keras_h5.so"
_keras_h5_lib: Optional[ctypes.CDLL] = None
_keras_h5_lock = threading.Lock()
_MESSAGE_BYTES = 4096


def _keras_h5_candidates() -> List[str]:
    """Where libcairn_keras_h5.so is looked for, first match wins: beside the loaded libcairn.so (an
    install or a build tree puts both in one directory), ``$CAIRN_BUILD_DIR/lib``, then the dynamic
    loader's search."""
    out: List[str] = []
    _ffi.library()
    loaded = _ffi.library_path()
    if loaded and os.sep in loaded:
        out.append(os.path.join(os.path.dirname(os.path.abspath(loaded)), _KERAS_H5_LIB))
    if os.environ.get("CAIRN_BUILD_DIR"):
        out.append(os.path.join(os.environ["CAIRN_BUILD_DIR"], "lib", _KERAS_H5_LIB))
    return [p for p in out if os.path.exists(p)] + [_KERAS_H5_LIB]


def _keras_h5(path: str) -> ctypes.CDLL:
    """The loaded HDF5 converter (tools/keras_h5_c.cpp); InvalidArgument naming ``path`` when this cairn
    was built without HDF5."""
    global _keras_h5_lib
    with _keras_h5_lock:
        if _keras_h5_lib is not None:
            return _keras_h5_lib
        tried: List[str] = []
        for cand in _keras_h5_candidates():
            try:
                lib = ctypes.CDLL(cand)
            except OSError as e:
                tried.append(f"{cand}: {_one_line(e)}")
                continue
            c, sz = ctypes.c_char_p, ctypes.c_size_t
            lib.cairn_keras_h5_import.argtypes = [c, c, c, c, c, c, c, sz]
            lib.cairn_keras_h5_import.restype = ctypes.c_int
            lib.cairn_keras_h5_export.argtypes = [c, c, c, c, sz]
            lib.cairn_keras_h5_export.restype = ctypes.c_int
            _keras_h5_lib = lib
            return lib
    raise _invalid(f"'{path}': Keras HDF5 files need a cairn built with HDF5 support (CAIRN_WITH_HDF5; Debian: "
                   f"libhdf5-dev), whose {_KERAS_H5_LIB} this Python could not load ({'; '.join(tried)}); "
                   f"convert the file to safetensors first")


def _keras_h5_call(fn: Any, *args: Optional[str]) -> None:
    """Calls one of the converter's functions; a failure raises its status with its message."""
    message = ctypes.create_string_buffer(_MESSAGE_BYTES)
    code = fn(*[a.encode() if a is not None else None for a in args], message, len(message))
    if code != 0:
        raise _errors.make_error(code, message.value.decode("utf-8", "replace"))


def _import_keras_h5(client: Any, id: str, path: str, parent: Optional[str], meta: Optional[Mapping[str, Any]],
                     durability: str) -> None:
    lib = _keras_h5(path)
    meta_json = json.dumps(dict(meta)) if meta is not None else None
    _keras_h5_call(lib.cairn_keras_h5_import, client.address, id, path, parent, meta_json, durability)


def _export_keras_h5(client: Any, id: str, path: str) -> None:
    _keras_h5_call(_keras_h5(path).cairn_keras_h5_export, client.address, id, path)


# ---- PyTorch ----

def _torch() -> Any:
    try:
        import torch  # noqa: PLC0415
    except ImportError as e:
        raise _errors.error("CAIRN_ERR_INVALID_ARGUMENT",
                            f"invalid argument: PyTorch files need the torch package ({_one_line(e)}); "
                            f"run with a Python that has it (CAIRN_PYTHON for `cairn import`)") from None
    return torch


def _to_numpy(torch: Any, t: Any, where: str) -> Tuple[np.ndarray, str]:
    from . import _torch_dtypes  # noqa: PLC0415 (needs torch)

    return _torch_dtypes.to_numpy(where, t.contiguous())


def _from_numpy(torch: Any, a: np.ndarray, dt: str, name: str) -> Any:
    from . import _torch_dtypes  # noqa: PLC0415 (needs torch)

    return _torch_dtypes.from_numpy(name, a, dt)


def _json_or_none(value: Any) -> Any:
    """``value`` as JSON-compatible data (mappings as lists of pairs, to keep their order), or None."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        items = []
        for k, v in value.items():
            jv = _json_or_none(v)
            if not isinstance(k, str) or (jv is None and v is not None):
                return None
            items.append([k, jv])
        return {"pairs": items}
    if isinstance(value, (list, tuple)):
        out = [_json_or_none(v) for v in value]
        return None if any(o is None and v is not None for o, v in zip(out, value)) else {"list": out}
    return None


def _from_json(value: Any) -> Any:
    if isinstance(value, dict) and "pairs" in value:
        return collections.OrderedDict((k, _from_json(v)) for k, v in value["pairs"])
    if isinstance(value, dict) and "list" in value:
        return [_from_json(v) for v in value["list"]]
    return value


def _import_torch(client: Any, id: str, path: str, parent: Optional[str], meta: Optional[Mapping[str, Any]],
                  durability: str, progress: bool = False) -> None:
    torch = _torch()
    if not os.path.isfile(path):
        raise _errors.error("CAIRN_ERR_NOT_FOUND", f"not found: '{path}' does not exist or is not a file")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 -- torch raises many kinds; all mean "not loadable"
        raise _invalid(f"'{path}' does not load with torch.load(weights_only=True): "
                       f"{type(e).__name__}: {_one_line(e)}") from None
    if not isinstance(obj, Mapping):
        raise _invalid(f"'{path}' holds a {type(obj).__name__}, not a state dict (a mapping of names to tensors)")

    tensors: Dict[str, np.ndarray] = {}
    dtypes: Dict[str, str] = {}
    parameters: List[str] = []
    nested = False

    def walk(m: Mapping[Any, Any], prefix: str, keys: str) -> Dict[str, Any]:
        nonlocal nested
        node: Dict[str, Any] = {"type": "OrderedDict" if isinstance(m, collections.OrderedDict) else "dict", "items": []}
        md = _json_or_none(getattr(m, "_metadata", None))
        if md is not None:
            node["_metadata"] = md
        for k, v in m.items():
            where = f"'{path}': key {keys + repr(k)}"
            if not isinstance(k, str) or not k:
                raise _invalid(f"{where} is not a non-empty string, so this is not a state dict")
            name = prefix + k
            if isinstance(v, Mapping):
                nested = True
                node["items"].append([k, walk(v, name + ".", keys + repr(k) + " -> ")])
                continue
            if not isinstance(v, torch.Tensor):
                raise _invalid(f"{where} holds a value of type {type(v).__name__}, not a tensor, so this is not a state dict")
            if name in tensors:
                raise _invalid(f"{where}: the flattened name {name!r} is used twice")
            tensors[name], dt = _to_numpy(torch, v, where)
            if dt in ("BF16", "F8_E4M3", "F8_E5M2"):
                dtypes[name] = dt
            if isinstance(v, torch.nn.Parameter):
                parameters.append(name)
            node["items"].append([k, name])
        return node

    tree = walk(obj, "", "")
    record: Dict[str, Any] = {"format": "torch", "file": os.path.basename(path), "container": tree["type"]}
    if "_metadata" in tree:
        record["_metadata"] = tree["_metadata"]
    if nested:
        record["tree"] = tree
    if parameters:
        record["parameters"] = parameters
    metadata = dict(meta or {})
    metadata[RECORD_KEY] = record
    bar = _progress.bar(_progress.bytes_of(tensors.values()), f"import {id}", progress)
    try:
        client.save_model(id, tensors, parent=parent, meta=metadata, durability=durability, dtypes=dtypes,
                          wait=True, on_bytes=bar.update if progress else None)
    finally:
        bar.close()


def _export_torch(client: Any, id: str, path: str, progress: bool = False) -> None:
    torch = _torch()
    info = client.show(id)
    stored = {t["name"]: t["dtype"] for t in info.get("tensors", [])}
    record = (info.get("metadata") or {}).get(RECORD_KEY)
    if not isinstance(record, dict) or record.get("format") != "torch":
        record = {}
    arrays = client.load_model(id, copy=True)
    parameters = set(record.get("parameters", []))
    tensors = collections.OrderedDict()
    bar = _progress.bar(_progress.bytes_of(arrays.values()), f"export {id}", progress)
    for name, a in arrays.items():
        t = _from_numpy(torch, a, stored.get(name, ""), name)
        tensors[name] = torch.nn.Parameter(t, requires_grad=t.is_floating_point()) if name in parameters else t
        bar.update(a.nbytes)

    def build(node: Mapping[str, Any]) -> Any:
        out: Any = collections.OrderedDict() if node.get("type") == "OrderedDict" else {}
        for k, v in node["items"]:
            out[k] = build(v) if isinstance(v, dict) else tensors[v]
        if "_metadata" in node:
            out._metadata = _from_json(node["_metadata"])
        return out

    if "tree" in record:
        try:
            obj = build(record["tree"])
        except KeyError as e:
            raise _invalid(f"model {id!r} has no tensor {e.args[0]!r}, which its recorded state dict layout names") from None
    else:
        obj = tensors if record.get("container", "OrderedDict") == "OrderedDict" else dict(tensors)
        if "_metadata" in record:
            obj._metadata = _from_json(record["_metadata"])
    tmp = path + ".cairn-tmp"
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    except OSError as e:
        raise _errors.error("CAIRN_ERR_IO", f"I/O error: writing '{path}': {_one_line(e)}") from None
    finally:
        bar.close()
        if os.path.exists(tmp):
            os.unlink(tmp)


# ---- the API ----

def import_file(client: Any, id: str, path: PathLike, parent: Optional[str] = None,
                meta: Optional[Mapping[str, Any]] = None, durability: str = "global", *, progress: bool = False) -> None:
    """Stores the model file ``path`` as model ``id`` (format from the extension).

    ``.pt``/``.pth``/``.bin``: loaded here with ``torch.load(weights_only=True)``; nested dicts are
    flattened with dots (``{"encoder": {"w": t}}`` -> ``encoder.w``). ``.safetensors`` goes through
    libcairn, ``.h5`` through libcairn_keras_h5. ``meta`` is merged into the model's metadata (the import's own
    record is kept under ``"cairn.import"``). Returns once ``durability`` is reached.
    ``progress=True`` shows a progress bar on stderr (off by default).
    """
    p = os.fspath(path)
    fmt = file_format(p)
    if fmt == "torch":
        _import_torch(client, id, p, parent, meta, durability, progress)
        return
    if fmt == "safetensors":
        client.model_put_file(id, p, parent=parent, durability=durability, meta=meta)
        return
    _import_keras_h5(client, id, p, parent, meta, durability)


def export_file(client: Any, id: str, path: PathLike, *, progress: bool = False) -> None:
    """Writes model ``id`` to ``path`` in the format of its extension. A model imported from a file of
    that format is written back with its recorded layout, so the framework loads the same values.
    ``progress=True`` shows a progress bar on stderr (off by default)."""
    p = os.fspath(path)
    fmt = file_format(p)
    if fmt == "torch":
        _export_torch(client, id, p, progress)
        return
    if fmt == "safetensors":
        client.model_get_file(id, p)
        return
    _export_keras_h5(client, id, p)


def _main(argv: Optional[List[str]] = None) -> int:
    import argparse  # noqa: PLC0415

    ap = argparse.ArgumentParser(prog="python3 -m cairn.io", description="import/export model files with cairn")
    sub = ap.add_subparsers(dest="cmd", required=True)
    imp = sub.add_parser("import")
    imp.add_argument("id")
    imp.add_argument("file")
    imp.add_argument("--parent")
    imp.add_argument("--meta")
    imp.add_argument("--durability", default="global")
    imp.add_argument("--progress", action="store_true")
    exp = sub.add_parser("export")
    exp.add_argument("id")
    exp.add_argument("file")
    exp.add_argument("--progress", action="store_true")
    args = ap.parse_args(argv)
    from .client import connect  # noqa: PLC0415

    try:
        meta = None
        if args.cmd == "import" and args.meta:
            try:
                meta = json.loads(args.meta)
            except ValueError:
                meta = None
            if not isinstance(meta, dict):
                raise _invalid("--meta must be a JSON object")
        with connect() as c:
            if args.cmd == "import":
                import_file(c, args.id, args.file, parent=args.parent, meta=meta, durability=args.durability,
                            progress=args.progress)
            else:
                export_file(c, args.id, args.file, progress=args.progress)
    except CairnError as e:
        print(f"cairn: {_one_line(e)}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 -- one line, never a traceback
        print(f"cairn: internal error: {type(e).__name__}: {_one_line(e)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main())
