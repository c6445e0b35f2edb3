"""`cairn import` / `cairn export`: files written by the real safetensors, h5py (in Keras' layout) and
torch.save go in and come back out so that their own readers see the same structure and values."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ctypes_env
from stfiles import load_file, rand, save_file

h5py = pytest.importorskip("h5py")


def hdf5_built():
    cache = (os.environ.get("CAIRN_BUILD_DIR") or "") + "/CMakeCache.txt"
    return os.path.exists(cache) and "CAIRN_WITH_HDF5:BOOL=ON" in open(cache).read()


needs_hdf5 = pytest.mark.skipif(not hdf5_built(), reason="cairn built without HDF5 (CAIRN_WITH_HDF5=OFF)")


def one_line_error(r, *needles):
    assert r.returncode != 0, r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    for n in needles:
        assert n.lower() in lines[0].lower(), lines[0]
    return lines[0]


# ---- safetensors ----

def test_safetensors_import_export_is_byte_exact(daemon, tmp):
    rng = np.random.default_rng(1)
    tensors = {"conv.weight": rand(rng, (16, 3, 3, 3), np.float32), "conv.bias": rand(rng, (16,), np.float16),
               "fc.weight": rand(rng, (10, 400), np.float64), "steps": rand(rng, (), np.int64)}
    src = tmp / "m.safetensors"
    save_file(tensors, str(src), metadata={"framework": "numpy"})
    daemon.cairn("import", "st", src, "--meta", '{"score": 0.5}')
    daemon.cairn("export", "st", tmp / "out.safetensors")
    assert (tmp / "out.safetensors").read_bytes() == src.read_bytes()
    back = load_file(str(tmp / "out.safetensors"))
    assert list(back) == list(load_file(str(src)))
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and np.array_equal(back[k], v)
    assert json.loads(daemon.cairn("show", "st").stdout)["metadata"]["score"] == 0.5


# ---- Keras HDF5 ----

def h5_describe(path):
    """Everything an h5py reader sees: groups and their member order, attributes (order, HDF5 type,
    shape, values), datasets (dtype, shape, chunking, filters, bytes) and their attributes."""
    def attrs(o):
        res = []
        for k in o.attrs:
            aid = o.attrs.get_id(k)
            v = o.attrs[k]
            if isinstance(v, h5py.Empty):
                val = ("empty", str(v.dtype))
            else:
                arr = np.asarray(v)
                val = (arr.dtype.str, arr.shape, arr.tolist())
            t = aid.get_type()
            is_str = isinstance(t, h5py.h5t.TypeStringID)
            res.append((k, t.get_class(), t.get_size(), is_str and t.is_variable_str(), is_str and t.get_cset(),
                        is_str and t.get_strpad(), aid.shape, val))
        return res

    out = []
    with h5py.File(path, "r") as f:
        out.append(("/", list(f.keys()), attrs(f)))

        def visit(name, o):
            if isinstance(o, h5py.Group):
                out.append((name, list(o.keys()), attrs(o)))
            else:
                t = o.id.get_type()
                out.append((name, o.dtype.str, t.get_order() if hasattr(t, "get_order") else None, o.shape, o.chunks,
                            o.compression, o.compression_opts, o.shuffle, o[()].tobytes(), attrs(o)))
        f.visititems(visit)
    return out


def add_layer(parent, name, weights, vlen_names):
    """A Keras 2 layer group: attribute weight_names, datasets <layer>/<weight>:0 (Keras' save_weights)."""
    g = parent.create_group(name)
    names = [f"{name}/{w}:0".encode() for w in weights]
    if not names:
        g.attrs["weight_names"] = np.asarray([])  # what Keras writes for a layer without weights
    elif vlen_names:
        g.attrs["weight_names"] = names  # h5py 3: variable-length strings
    else:
        g.attrs["weight_names"] = np.array(names)  # fixed-length 'S' strings (Keras with h5py 2)
    for w, value in weights.items():
        d = g.create_dataset(f"{name}/{w}:0", value.shape, dtype=value.dtype)
        d[()] = value
    return g


def keras_layers(rng):
    return [
        ("conv2d", {"kernel": rand(rng, (3, 3, 3, 8), np.float32), "bias": rand(rng, (8,), np.float32)}),
        ("batch_normalization", {k: rand(rng, (8,), np.float32) for k in ("gamma", "beta", "moving_mean", "moving_variance")}),
        ("max_pooling2d", {}),
        ("conv2d_1", {"kernel": rand(rng, (3, 3, 8, 16), np.float16), "bias": rand(rng, (16,), np.float16)}),
        ("flatten", {}),
        ("dense", {"kernel": rand(rng, (1024, 64), np.float32), "bias": rand(rng, (64,), np.float32)}),
        ("dense_1", {"kernel": rand(rng, (64, 10), np.float16), "bias": rand(rng, (10,), np.float16)}),
    ]


def write_keras_weights(path, rng, vlen_names):
    """model.save_weights("x.h5") of Keras 2: root attrs layer_names, backend, keras_version."""
    layers = keras_layers(rng)
    with h5py.File(path, "w") as f:
        names = [n.encode() for n, _ in layers]
        f.attrs["layer_names"] = names if vlen_names else np.array(names)
        f.attrs["backend"] = "tensorflow"
        f.attrs["keras_version"] = "2.11.0"
        for name, weights in layers:
            add_layer(f, name, weights, vlen_names)
    return layers


def write_keras_model(path, rng):
    """model.save("x.h5") of Keras 2: model_config and training_config at the root, the weights under
    /model_weights, optimizer state under /optimizer_weights; plus what other writers do (chunked
    and compressed, big-endian, bool and integer datasets, numeric attributes, tracked order)."""
    layers = keras_layers(rng)
    config = {"class_name": "Sequential", "config": {"name": "sequential", "layers": [
        {"class_name": {"conv2d": "Conv2D", "batch_normalization": "BatchNormalization", "max_pooling2d": "MaxPooling2D",
                        "conv2d_1": "Conv2D", "flatten": "Flatten", "dense": "Dense", "dense_1": "Dense"}[n],
         "config": {"name": n}} for n, _ in layers]}}
    with h5py.File(path, "w") as f:
        f.attrs["backend"] = "tensorflow"
        f.attrs["keras_version"] = "2.11.0"
        f.attrs["model_config"] = json.dumps(config)
        f.attrs["training_config"] = json.dumps({"loss": "mse"})
        mw = f.create_group("model_weights")
        mw.attrs["layer_names"] = [n.encode() for n, _ in layers]
        mw.attrs["backend"] = "tensorflow"
        mw.attrs["keras_version"] = "2.11.0"
        for name, weights in layers:
            add_layer(mw, name, weights, True)
        ow = f.create_group("optimizer_weights", track_order=True)
        ow.attrs["weight_names"] = [b"Adam/iter:0", b"Adam/dense/kernel/m:0"]
        ow.create_dataset("Adam/iter:0", data=np.int64(1200))
        ow.create_dataset("Adam/dense/kernel/m:0", data=rand(rng, (1024, 64), np.float32), chunks=(128, 64),
                          compression="gzip", compression_opts=4, shuffle=True)
        extra = f.create_group("extra")
        extra.create_dataset("big_endian", data=rand(rng, (5, 7), np.dtype(">f4")))
        extra.create_dataset("mask", data=rand(rng, (33,), np.bool_))
        d = extra.create_dataset("counts", data=rand(rng, (4, 4), np.uint16))
        d.attrs["unit"] = "items"
        d.attrs["scale"] = np.float64(0.25)
        d.attrs["dims"] = np.array([4, 4], np.int32)
        extra.attrs["none"] = h5py.Empty("f4")
    return layers


@needs_hdf5
@pytest.mark.parametrize("vlen_names", [False, True], ids=["fixed-strings", "vlen-strings"])
def test_keras_weights_round_trip(daemon, tmp, vlen_names):
    rng = np.random.default_rng(2)
    src = tmp / "weights.h5"
    layers = write_keras_weights(src, rng, vlen_names)
    daemon.cairn("import", "kw", src, "--meta", '{"score": 0.8}')
    daemon.cairn("export", "kw", tmp / "out.h5")
    assert h5_describe(tmp / "out.h5") == h5_describe(src)

    shown = json.loads(daemon.cairn("show", "kw").stdout)
    names = [t["name"] for t in shown["tensors"]]
    assert names == [f"{n}.{w}" for n, ws in layers for w in ws]  # Keras' order: layer_names, then weight_names
    dtypes = {t["name"]: t["dtype"] for t in shown["tensors"]}
    assert dtypes["dense_1.kernel"] == "F16" and dtypes["dense.kernel"] == "F32"
    assert shown["metadata"]["score"] == 0.8
    record = shown["metadata"]["cairn.import"]
    assert record["format"] == "keras-h5" and record["layer_names"] == [n for n, _ in layers]
    assert record["weight_names"]["conv2d"] == ["conv2d/kernel:0", "conv2d/bias:0"]

    # The layers form a chain graph, so the catalog finds this model as the best ancestor of its own
    # architecture (and of a variant with a different head).
    arch = shown["architecture"]
    assert [l["name"] for l in arch["layers"]] == [n for n, _ in layers]
    assert arch["layers"][3]["inputs"] == ["max_pooling2d"]
    (tmp / "g.json").write_text(json.dumps(arch))
    match = json.loads(daemon.cairn("match", tmp / "g.json").stdout)
    assert match["model"] == "kw", match
    arch["layers"][-1]["config"]["weights"][0]["shape"] = [64, 100]
    (tmp / "g2.json").write_text(json.dumps(arch))
    match = json.loads(daemon.cairn("match", tmp / "g2.json").stdout)
    assert match["model"] == "kw", match

    # Values as the framework reads them (h5py, Keras' own reader of these files).
    with h5py.File(tmp / "out.h5", "r") as f:
        assert [n.decode() if isinstance(n, bytes) else n for n in f.attrs["layer_names"]] == [n for n, _ in layers]
        for name, weights in layers:
            for w, value in weights.items():
                got = f[name][f"{name}/{w}:0"][()]
                assert got.dtype == value.dtype and np.array_equal(got, value)


@needs_hdf5
def test_keras_model_file_round_trip(daemon, tmp):
    rng = np.random.default_rng(3)
    src = tmp / "model.hdf5"
    write_keras_model(src, rng)
    daemon.cairn("import", "km", src)
    daemon.cairn("export", "km", tmp / "out.hdf5")
    assert h5_describe(tmp / "out.hdf5") == h5_describe(src)
    with h5py.File(tmp / "out.hdf5", "r") as f:
        assert list(f["optimizer_weights"].keys()) == ["Adam"]
        assert f["optimizer_weights"].id.get_create_plist().get_link_creation_order() != 0
        assert f["extra/big_endian"].dtype == np.dtype(">f4")
        assert f["extra/mask"].dtype == np.bool_

    shown = json.loads(daemon.cairn("show", "km").stdout)
    names = [t["name"] for t in shown["tensors"]]
    assert names[0] == "conv2d.kernel" and "optimizer_weights/Adam/iter:0" in names and "extra/mask" in names
    types = {l["name"]: l["type"] for l in shown["architecture"]["layers"]}
    assert types["dense"] == "Dense" and types["batch_normalization"] == "BatchNormalization"

    # The same weights exported to safetensors and read back with the reference reader.
    daemon.cairn("export", "km", tmp / "out.safetensors")
    st = load_file(str(tmp / "out.safetensors"))
    with h5py.File(src, "r") as f:
        assert np.array_equal(st["dense.kernel"], f["model_weights/dense/dense/kernel:0"][()])
        assert np.array_equal(st["extra/big_endian"], f["extra/big_endian"][()])


@needs_hdf5
def test_h5_export_of_a_model_that_was_not_imported_from_h5(daemon, tmp):
    rng = np.random.default_rng(4)
    tensors = {"stem.weight": rand(rng, (8, 3, 3, 3), np.float32), "stem.bias": rand(rng, (8,), np.float16),
               "head.w": rand(rng, (8, 2), np.float64), "mask": rand(rng, (4,), np.bool_)}
    save_file(tensors, str(tmp / "m.safetensors"))
    daemon.cairn("put", "plain", tmp / "m.safetensors")
    daemon.cairn("export", "plain", tmp / "plain.h5")
    order = [t["name"] for t in json.loads(daemon.cairn("show", "plain").stdout)["tensors"]]  # safetensors' order
    layers = list(dict.fromkeys(n.rsplit(".", 1)[0] for n in order))
    with h5py.File(tmp / "plain.h5", "r") as f:
        assert [n.decode() if isinstance(n, bytes) else n for n in f.attrs["layer_names"]] == layers
        assert list(f["stem"].attrs["weight_names"]) in (["stem/weight:0", "stem/bias:0"], [b"stem/weight:0", b"stem/bias:0"])
        assert np.array_equal(f["stem/stem/bias:0"][()], tensors["stem.bias"]) and f["stem/stem/bias:0"].dtype == np.float16
        assert np.array_equal(f["mask/mask/mask:0"][()], tensors["mask"])
    # ...and that file imports again under Keras' names.
    daemon.cairn("import", "plain2", tmp / "plain.h5")
    shown = json.loads(daemon.cairn("show", "plain2").stdout)
    assert [t["name"] for t in shown["tensors"]] == [n if "." in n else f"{n}.{n}" for n in order]


@needs_hdf5
def test_bad_h5_files_get_one_line_errors(daemon, tmp):
    rng = np.random.default_rng(5)
    good = tmp / "good.h5"
    write_keras_weights(good, rng, True)
    data = good.read_bytes()
    (tmp / "truncated.h5").write_bytes(data[: len(data) // 2])
    one_line_error(daemon.cairn("import", "t", tmp / "truncated.h5", check=False), "truncated.h5")
    (tmp / "garbage.h5").write_bytes(b"not an hdf5 file at all" * 10)
    one_line_error(daemon.cairn("import", "t", tmp / "garbage.h5", check=False), "garbage.h5", "not an HDF5 file")
    with h5py.File(tmp / "plain.h5", "w") as f:
        f.create_dataset("x", data=np.zeros(3))
    one_line_error(daemon.cairn("import", "t", tmp / "plain.h5", check=False), "layer_names")
    with h5py.File(tmp / "strings.h5", "w") as f:
        f.attrs["layer_names"] = [b"embed"]
        g = f.create_group("embed")
        g.attrs["weight_names"] = [b"embed/vocab:0"]
        g.create_dataset("embed/vocab:0", data=np.array([b"a", b"bc"]))
    one_line_error(daemon.cairn("import", "t", tmp / "strings.h5", check=False), "/embed/embed/vocab:0", "string")
    with h5py.File(tmp / "missing.h5", "w") as f:
        f.attrs["layer_names"] = [b"dense"]
        f.create_group("dense").attrs["weight_names"] = [b"dense/kernel:0"]
    one_line_error(daemon.cairn("import", "t", tmp / "missing.h5", check=False), "dense/kernel:0")
    one_line_error(daemon.cairn("import", "t", tmp / "absent.h5", check=False), "absent.h5")
    assert daemon.alive()
    assert daemon.cairn("export", "t", tmp / "t.h5", check=False).returncode != 0  # nothing was stored
    daemon.cairn("import", "good", good)
    # A BF16 tensor has no HDF5 type: the export says which tensor.
    from stfiles import write_raw
    write_raw(tmp / "bf.safetensors", [("w", "BF16", (2,), b"\x80\x3f\x00\x40")])
    daemon.cairn("put", "bf", tmp / "bf.safetensors")
    one_line_error(daemon.cairn("export", "bf", tmp / "bf.h5", check=False), "'w'", "BF16")
    assert not (tmp / "bf.h5").exists() and not (tmp / "bf.h5.cairn-tmp").exists()
    assert daemon.alive()


# ---- PyTorch ----

def torch_env(daemon):
    return dict(ctypes_env(daemon.env), CAIRN_PYTHON=sys.executable)


def run_cairn(daemon, *args):
    from conftest import CAIRN
    return subprocess.run([str(CAIRN), *map(str, args)], env=torch_env(daemon), capture_output=True, text=True,
                          timeout=600)


def test_torch_state_dict_round_trip(daemon, tmp):
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    sd = torchvision.models.resnet18().state_dict()
    sd["extra.bf16"] = torch.randn(7, 5).to(torch.bfloat16)
    sd["extra.int8"] = torch.randint(-100, 100, (9,), dtype=torch.int8)
    sd["extra.mask"] = torch.rand(6) > 0.5
    torch.save(sd, tmp / "resnet18.pt")
    r = run_cairn(daemon, "import", "r18", tmp / "resnet18.pt", "--meta", '{"arch": "resnet18"}')
    assert r.returncode == 0, r.stderr
    r = run_cairn(daemon, "export", "r18", tmp / "out.pt")
    assert r.returncode == 0, r.stderr

    orig = torch.load(tmp / "resnet18.pt", weights_only=True)
    back = torch.load(tmp / "out.pt", weights_only=True)
    assert type(back) is type(orig) and list(back) == list(orig)
    for k, v in orig.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape and torch.equal(back[k], v), k
    assert getattr(back, "_metadata", None) == getattr(orig, "_metadata", None)
    model = torchvision.models.resnet18()
    model.load_state_dict({k: v for k, v in back.items() if not k.startswith("extra.")})

    shown = json.loads(daemon.cairn("show", "r18").stdout)
    assert shown["metadata"]["arch"] == "resnet18" and shown["metadata"]["cairn.import"]["format"] == "torch"
    dt = {t["name"]: t["dtype"] for t in shown["tensors"]}
    assert dt["extra.bf16"] == "BF16" and dt["bn1.num_batches_tracked"] == "I64" and dt["extra.mask"] == "BOOL"

    # .bin is the same format; a fine-tuned child shares the unchanged tensors.
    sd["fc.bias"] = torch.zeros(1000)
    torch.save(sd, tmp / "ft.bin")
    r = run_cairn(daemon, "import", "r18-ft", tmp / "ft.bin", "--parent", "r18")
    assert r.returncode == 0, r.stderr
    assert daemon.cairn("lineage", "r18-ft", "--json").stdout.count("r18") >= 2
    r = run_cairn(daemon, "export", "r18-ft", tmp / "ft-out.safetensors")
    assert r.returncode == 0, r.stderr


def test_bad_torch_files_and_extensions_get_one_line_errors(daemon, tmp):
    torch = pytest.importorskip("torch")
    torch.save([torch.zeros(2), torch.ones(2)], tmp / "list.pt")
    one_line_error(run_cairn(daemon, "import", "x", tmp / "list.pt"), "list.pt", "not a state dict")
    torch.save({"epoch": 3, "w": torch.zeros(2)}, tmp / "ckpt.pt")
    one_line_error(run_cairn(daemon, "import", "x", tmp / "ckpt.pt"), "'epoch'", "int", "not a state dict")
    (tmp / "junk.pt").write_bytes(b"\x00garbage" * 100)
    one_line_error(run_cairn(daemon, "import", "x", tmp / "junk.pt"), "junk.pt", "weights_only")
    (tmp / "m.onnx").write_bytes(b"x")
    one_line_error(daemon.cairn("import", "x", tmp / "m.onnx", check=False), "m.onnx", "unknown extension '.onnx'")
    one_line_error(daemon.cairn("export", "x", tmp / "m.txt", check=False), "unknown extension '.txt'")
    one_line_error(daemon.cairn("import", "x", tmp / "noext", check=False), "no file extension")
    env = dict(torch_env(daemon), CAIRN_PYTHON=str(tmp / "no-such-python"))
    from conftest import CAIRN
    r = subprocess.run([str(CAIRN), "import", "x", str(tmp / "ckpt.pt")], env=env, capture_output=True, text=True)
    one_line_error(r, "no-such-python", "CAIRN_PYTHON")
    one_line_error(run_cairn(daemon, "export", "ghost", tmp / "ghost.pt"), "ghost")
    assert not (tmp / "ghost.pt").exists()
    assert daemon.alive()
    assert daemon.cairn("show", "x", check=False).returncode != 0


def build_python():
    """The interpreter the build recorded for `cairn import/export` (CMake's CAIRN_PYTHON)."""
    cache = os.path.join(os.environ.get("CAIRN_BUILD_DIR") or "", "CMakeCache.txt")
    if os.path.exists(cache):
        for line in open(cache):
            if line.startswith("CAIRN_PYTHON:"):
                return line.split("=", 1)[1].strip()
    return None


def test_pt_import_uses_the_build_python_not_the_first_python3_on_path(daemon, tmp):
    """A newcomer's pyenv/conda python3 first on PATH lacks torch and numpy: `cairn import m ref.pt`
    still works (the Python recorded at build time), and CAIRN_PYTHON pointing at such a Python gives
    one line naming it and what to install, not a traceback."""
    torch = pytest.importorskip("torch")
    python = build_python()
    if not python or subprocess.run([python, "-c", "import torch, numpy"], capture_output=True).returncode != 0:
        pytest.skip(f"the build's CAIRN_PYTHON ({python}) has no torch")
    bare = tmp / "bare-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    bare_python = bare / "bin" / "python3"
    assert subprocess.run([str(bare_python), "-c", "import torch"], capture_output=True).returncode != 0
    from conftest import CAIRN
    env = dict(ctypes_env(daemon.env), PATH=f"{bare / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    env.pop("CAIRN_PYTHON", None)
    sd = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "n": torch.tensor(3)}
    torch.save(sd, tmp / "ref.pt")

    r = subprocess.run([str(CAIRN), "import", "m", str(tmp / "ref.pt")], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([str(CAIRN), "export", "m", str(tmp / "back.pt")], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    back = torch.load(tmp / "back.pt", weights_only=True)
    assert list(back) == list(sd) and all(torch.equal(back[k], v) for k, v in sd.items())

    env["CAIRN_PYTHON"] = str(bare_python)
    for args in (["import", "m2", str(tmp / "ref.pt")], ["export", "m", str(tmp / "again.pt")]):
        r = subprocess.run([str(CAIRN), *args], env=env, capture_output=True, text=True, timeout=600)
        line = one_line_error(r, str(bare_python), "no module 'torch'", "pip install torch", "CAIRN_PYTHON",
                              f"{args[0]} of {args[2]}")
        assert "Traceback" not in r.stderr and line.startswith("cairn: "), r.stderr
    assert not (tmp / "again.pt").exists()
    assert daemon.cairn("show", "m2", check=False).returncode != 0
