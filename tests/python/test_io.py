"""cairn.io: import_file / export_file from Python (PyTorch natively, safetensors through libcairn,
Keras HDF5 through the build's libcairn_keras_h5), never through the `cairn` tool."""
import collections
import os
import subprocess

import numpy as np
import pytest

if os.environ.get("CAIRN_SANITIZED") == "1" and "libasan" not in os.environ.get("LD_PRELOAD", ""):
    pytest.skip("sanitized build: start this Python with LD_PRELOAD as in ctypes_env()", allow_module_level=True)

import cairn  # noqa: E402
from cairn import io as cio  # noqa: E402

torch = pytest.importorskip("torch")


def same_tensors(a, b):
    assert list(a) == list(b)
    for k in a:
        if isinstance(a[k], dict):
            same_tensors(a[k], b[k])
            continue
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(a[k], b[k]), k


def test_exported(client, tmp_path):
    assert cairn.import_file is cio.import_file and cairn.export_file is cio.export_file
    assert cio.file_format("a/b.SAFETENSORS") == "safetensors" and cio.file_format("x.hdf5") == "keras-h5"
    assert cio.file_format("pytorch_model.bin") == "torch"
    with pytest.raises(cairn.InvalidArgument, match="unknown extension '.onnx'"):
        cairn.import_file(client, "x", tmp_path / "m.onnx")


def test_state_dict_round_trip_with_every_torch_dtype(client, tmp_path):
    g = torch.Generator().manual_seed(0)
    sd = collections.OrderedDict()
    for dt in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
        sd[f"f.{str(dt)[6:]}"] = torch.randn(3, 4, generator=g).to(dt)
    for dt in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        sd[f"i.{str(dt)[6:]}"] = torch.randint(0, 100, (5,), generator=g).to(dt)
    sd["b.mask"] = torch.randn(7, generator=g) > 0
    sd["s.scalar"] = torch.tensor(42)
    sd["z.empty"] = torch.zeros(0, 3)
    sd["n.noncontiguous"] = torch.randn(4, 6, generator=g).t()
    sd["big.weight"] = torch.randn(512, 512, generator=g)  # through arena space, not inline
    sd._metadata = collections.OrderedDict([("", {"version": 1}), ("big", {"version": 2})])
    torch.save(sd, tmp_path / "all.pt")
    cairn.import_file(client, "io-all", tmp_path / "all.pt", meta={"note": "every dtype"})
    cairn.export_file(client, "io-all", tmp_path / "out.pt")
    back = torch.load(tmp_path / "out.pt", weights_only=True)
    same_tensors(back, sd)
    assert isinstance(back, collections.OrderedDict) and back._metadata == sd._metadata
    shown = client.show("io-all")
    assert shown["metadata"]["note"] == "every dtype"
    assert {t["name"]: t["dtype"] for t in shown["tensors"]}["f.bfloat16"] == "BF16"


def test_nested_dicts_are_flattened_with_dots_and_restored(client, tmp_path):
    sd = {"encoder": {"layer0.weight": torch.ones(2, 2), "norm": {"bias": torch.zeros(2)}},
          "head.weight": torch.full((3,), 2.0)}
    torch.save(sd, tmp_path / "nested.bin")
    cairn.import_file(client, "io-nested", tmp_path / "nested.bin")
    names = list(client.load_model("io-nested", copy=True))
    assert names == ["encoder.layer0.weight", "encoder.norm.bias", "head.weight"]
    cairn.export_file(client, "io-nested", tmp_path / "out.bin")
    back = torch.load(tmp_path / "out.bin", weights_only=True)
    assert type(back) is dict and type(back["encoder"]) is dict
    same_tensors(back, sd)
    # Exported as a flat state dict (safetensors) and back into PyTorch from there too.
    cairn.export_file(client, "io-nested", tmp_path / "flat.safetensors")
    cairn.import_file(client, "io-flat", tmp_path / "flat.safetensors", parent="io-nested")
    cairn.export_file(client, "io-flat", tmp_path / "flat.pt")
    flat = torch.load(tmp_path / "flat.pt", weights_only=True)
    assert list(flat) == names and torch.equal(flat["encoder.norm.bias"], torch.zeros(2))


def test_not_a_state_dict(client, tmp_path):
    torch.save({"model": {"w": torch.ones(1)}, "epoch": 3}, tmp_path / "ckpt.pt")
    with pytest.raises(cairn.InvalidArgument, match=r"'epoch'.*int.*not a state dict"):
        cairn.import_file(client, "io-bad", tmp_path / "ckpt.pt")
    torch.save({"w": torch.ones(2, dtype=torch.complex64)}, tmp_path / "complex.pt")
    with pytest.raises(cairn.InvalidArgument, match=r"'w'.*complex64"):
        cairn.import_file(client, "io-bad", tmp_path / "complex.pt")
    with pytest.raises(cairn.NotFound):
        cairn.import_file(client, "io-bad", tmp_path / "missing.pt")
    with pytest.raises(cairn.NotFound):
        client.show("io-bad")
    with pytest.raises(cairn.NotFound):
        cairn.export_file(client, "io-ghost", tmp_path / "ghost.pt")
    assert not (tmp_path / "ghost.pt").exists()


def test_safetensors_through_libcairn_and_h5_through_the_converter_library(client, tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    rng = np.random.default_rng(0)
    w = {"a.w": rng.standard_normal((4, 4)).astype(np.float32), "a.b": np.arange(4, dtype=np.int32)}
    st.save_file(w, str(tmp_path / "m.safetensors"))
    cairn.import_file(client, "io-st", tmp_path / "m.safetensors", meta={"score": 1})
    assert client.show("io-st")["metadata"] == {"score": 1}
    cairn.export_file(client, "io-st", tmp_path / "o.safetensors")
    assert (tmp_path / "o.safetensors").read_bytes() == (tmp_path / "m.safetensors").read_bytes()
    with pytest.raises(cairn.AlreadyExists):
        cairn.import_file(client, "io-st", tmp_path / "m.safetensors")
    try:
        cairn.export_file(client, "io-st", tmp_path / "o.h5")
    except cairn.InvalidArgument as e:
        assert "HDF5" in str(e)  # a build without HDF5 says so
        return
    h5py = pytest.importorskip("h5py")
    with h5py.File(tmp_path / "o.h5", "r") as f:
        assert np.array_equal(f["a/a/w:0"][()], w["a.w"])
    cairn.import_file(client, "io-h5", tmp_path / "o.h5")
    cairn.export_file(client, "io-h5", tmp_path / "o.pt")
    back = torch.load(tmp_path / "o.pt", weights_only=True)
    assert torch.equal(back["a.w"], torch.from_numpy(w["a.w"]))
    # The converter's failures arrive as their status code, not parsed from the message.
    with pytest.raises(cairn.AlreadyExists, match="io-h5"):
        cairn.import_file(client, "io-h5", tmp_path / "o.h5")
    with pytest.raises(cairn.NotFound, match="no-such-model"):
        cairn.export_file(client, "no-such-model", tmp_path / "n.h5")


def hdf5_built():
    cache = os.path.join(os.environ.get("CAIRN_BUILD_DIR") or os.path.join(os.path.dirname(__file__), "..", "..", "build"),
                         "CMakeCache.txt")
    return os.path.exists(cache) and "CAIRN_WITH_HDF5:BOOL=ON" in open(cache).read()


def test_every_format_imports_and_exports_without_running_the_cairn_tool(client, tmp_path, monkeypatch):
    """cairn.io goes through libraries only: with a `cairn` first on PATH and in CAIRN_TOOL that fails
    and leaves a mark, and with every way of starting a process from Python refused, safetensors,
    PyTorch and Keras HDF5 files still go in and come back out."""
    st = pytest.importorskip("safetensors.numpy")
    tool = tmp_path / "bin" / "cairn"
    tool.parent.mkdir()
    mark = tmp_path / "the-tool-ran"
    tool.write_text(f"#!/bin/sh\ntouch '{mark}'\nexit 3\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(tool.parent))
    monkeypatch.setenv("CAIRN_TOOL", str(tool))

    def refuse(*args, **kwargs):
        raise AssertionError(f"cairn.io started a process: {args[:2]}")

    monkeypatch.setattr(subprocess, "Popen", refuse)  # subprocess.run, call, check_output
    for name in ("system", "popen", "posix_spawn", "posix_spawnp", "fork", "execv", "execve", "execvp", "execvpe"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, refuse)

    w = {"l.w": np.arange(12, dtype=np.float32).reshape(3, 4), "l.b": np.ones(4, dtype=np.float32)}
    st.save_file(w, str(tmp_path / "in.safetensors"))
    cairn.import_file(client, "notool-st", tmp_path / "in.safetensors")
    cairn.export_file(client, "notool-st", tmp_path / "out.safetensors")
    assert (tmp_path / "out.safetensors").read_bytes() == (tmp_path / "in.safetensors").read_bytes()

    torch.save({k: torch.from_numpy(v) for k, v in w.items()}, tmp_path / "in.pt")
    cairn.import_file(client, "notool-pt", tmp_path / "in.pt")
    cairn.export_file(client, "notool-pt", tmp_path / "out.pt")
    back = torch.load(tmp_path / "out.pt", weights_only=True)
    assert list(back) == list(w) and all(torch.equal(back[k], torch.from_numpy(v)) for k, v in w.items())

    if hdf5_built():
        cairn.export_file(client, "notool-st", tmp_path / "out.h5")
        cairn.import_file(client, "notool-h5", tmp_path / "out.h5", meta={"from": "h5"})
        assert client.show("notool-h5")["metadata"]["from"] == "h5"
        cairn.export_file(client, "notool-h5", tmp_path / "again.h5")
        loaded = client.load_model("notool-h5", copy=True)
        assert all(np.array_equal(loaded[k], v) for k, v in w.items())
        with pytest.raises(cairn.NotFound, match="notool-ghost"):
            cairn.export_file(client, "notool-ghost", tmp_path / "ghost.h5")
    assert not mark.exists(), "the cairn tool ran"


def test_h5_without_the_converter_library_names_what_to_build(client, tmp_path, monkeypatch):
    monkeypatch.setattr(cio, "_KERAS_H5_LIB", "libcairn_keras_h5_absent.so")
    monkeypatch.setattr(cio, "_keras_h5_lib", None)
    with pytest.raises(cairn.InvalidArgument, match=r"'.*m\.h5'.*CAIRN_WITH_HDF5.*libcairn_keras_h5_absent\.so"):
        cairn.import_file(client, "io-noh5", tmp_path / "m.h5")
    with pytest.raises(cairn.NotFound):
        client.show("io-noh5")
