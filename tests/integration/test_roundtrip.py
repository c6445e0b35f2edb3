"""Safetensors files written by other tools round-trip exactly through `cairn put` / `cairn get`."""
import filecmp

import numpy as np

from stfiles import load_file, rand, save_file, write_raw

NUMPY_DTYPES = [np.float64, np.float32, np.float16, np.int64, np.int32, np.int16, np.int8,
                np.uint64, np.uint32, np.uint16, np.uint8, np.bool_]


def test_every_dtype_scalars_empty_and_metadata_round_trip_byte_exact(daemon, tmp):
    rng = np.random.default_rng(1)
    tensors = {}
    for i, dt in enumerate(NUMPY_DTYPES):
        tensors[f"t{i}.{np.dtype(dt).name}"] = rand(rng, (3, 5), dt)
    tensors["scalar.f32"] = np.array(3.5, dtype=np.float32)
    tensors["scalar.i64"] = np.array(-7, dtype=np.int64)
    tensors["empty.f32"] = np.zeros((0, 4), dtype=np.float32)
    tensors["big.weight"] = rand(rng, (5, 1024, 1024), np.float32)  # 20 MiB: two chunks
    src = tmp / "model.safetensors"
    save_file(tensors, str(src), metadata={"format": "np", "note": "ünïcode ok"})

    daemon.cairn("put", "m1", src)
    out = tmp / "out.safetensors"
    daemon.cairn("get", "m1", "-o", out)
    assert filecmp.cmp(src, out, shallow=False), "the file did not come back byte for byte"
    back = load_file(str(out))
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape
        assert np.array_equal(back[k], v)


def test_bf16_and_f8_written_by_a_raw_writer(daemon, tmp):
    rng = np.random.default_rng(2)
    raw = [
        ("a.bf16", "BF16", (4, 4), rng.bytes(32)),
        ("b.f8_e4m3", "F8_E4M3", (8,), rng.bytes(8)),
        ("c.f8_e5m2", "F8_E5M2", (2, 3), rng.bytes(6)),
        ("d.bool", "BOOL", (), b"\x01"),
    ]
    src = tmp / "raw.safetensors"
    write_raw(src, raw, metadata={"k": "v"})
    daemon.cairn("put", "raw", src)
    out = tmp / "raw-out.safetensors"
    daemon.cairn("get", "raw", "-o", out)
    assert src.read_bytes() == out.read_bytes()


def test_get_tensor_subsets(daemon, tmp):
    rng = np.random.default_rng(3)
    tensors = {f"layer{i}.weight": rand(rng, (64, 64 * (i + 1)), np.float32) for i in range(6)}
    tensors["huge"] = rand(rng, (40, 1024, 256), np.float32)  # 40 MiB: three chunks
    src = tmp / "m.safetensors"
    save_file(tensors, str(src), metadata={"epoch": "3"})
    daemon.cairn("put", "m", src)
    out = tmp / "sub.safetensors"
    daemon.cairn("get", "m", "-o", out, "--tensor", "layer2.weight", "--tensor", "huge")
    back = load_file(str(out))
    assert sorted(back) == ["huge", "layer2.weight"]
    assert np.array_equal(back["huge"], tensors["huge"])
    assert np.array_equal(back["layer2.weight"], tensors["layer2.weight"])
    r = daemon.cairn("get", "m", "-o", out, "--tensor", "missing", check=False)
    assert r.returncode != 0 and "missing" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_show_ls_lineage_and_rm(daemon, tmp):
    rng = np.random.default_rng(4)
    base = {"w": rand(rng, (256, 256), np.float32), "b": rand(rng, (256,), np.float32)}
    save_file(base, str(tmp / "base.safetensors"))
    child = dict(base, b=rand(rng, (256,), np.float32))
    save_file(child, str(tmp / "child.safetensors"))
    daemon.cairn("put", "base", tmp / "base.safetensors", "--meta", '{"score": 0.7}')
    daemon.cairn("put", "child", tmp / "child.safetensors", "--parent", "base", "--durability", "memory")
    import json
    show = json.loads(daemon.cairn("show", "child").stdout)
    assert show["parent"] == "base" and len(show["tensors"]) == 2
    assert json.loads(daemon.cairn("show", "base").stdout)["metadata"]["score"] == 0.7
    ls = json.loads(daemon.cairn("ls", "--json").stdout)
    assert {m["id"] for m in ls} == {"base", "child"}
    lin = json.loads(daemon.cairn("lineage", "child", "--json").stdout)
    assert lin["ancestors"] == ["base"]
    assert json.loads(daemon.cairn("lineage", "base", "--json").stdout)["descendants"] == ["child"]
    # rm retires: base leaves ls but child, which inherits from it, is untouched.
    daemon.cairn("rm", "base")
    assert {m["id"] for m in json.loads(daemon.cairn("ls", "--json").stdout)} == {"child"}
    daemon.cairn("gc")
    assert json.loads(daemon.cairn("show", "base").stdout)["collected"] is True
    daemon.cairn("get", "child", "-o", tmp / "back.safetensors")
    assert (tmp / "back.safetensors").read_bytes() == (tmp / "child.safetensors").read_bytes()
    daemon.cairn("rm", "child")
    daemon.cairn("gc")
    assert json.loads(daemon.cairn("ls", "--all", "--json").stdout) == []
    assert daemon.stats()["repository"]["physical_bytes"] == 0
