"""The Python client's names follow the C API's (cairn.h; docs/api.md): each new name works, each
older name still works for one release and warns, naming its replacement, and the names the design
fixes (put_tensor, get_tensor, save_model, load_model) do not warn."""
import warnings

import numpy as np
import pytest

import cairn


def test_named_tensor_calls(client):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    client.tensor_put("names/a", a)
    assert client.tensor_info("names/a") == ("F32", (3, 4), 48)
    np.testing.assert_array_equal(client.tensor_get("names/a"), a)
    assert client.tensor_poll("names/a") is True
    client.tensor_delete("names/a")
    assert client.tensor_poll("names/a") is False
    with pytest.raises(cairn.NotFound):
        client.tensor_delete("names/a")


def test_model_calls(client, tmp_path):
    x = np.linspace(0, 1, 64, dtype=np.float32)
    with client.model_create("names-m") as w:
        w.add_tensor("x", x)
        w.add_tensors({"y": x * 2})
        space = w.add_tensor_space("z", "F32", (64,))
        space[...] = x * 3
        w.seal_tensor("z")
        t = w.commit("memory", pipelined=True)
    assert t.reached == "sent"
    assert t.wait() == "memory"
    with client.model_create("names-c", "names-m") as w:
        w.inherit_tensor(["x", "y"])
        w.commit("global", wait=True)
    client.pipeline_flush()
    assert client.pipeline_in_flight == 0
    with client.model_open("names-c") as r:
        assert [t[0] for t in r.tensors] == ["x", "y"]
        np.testing.assert_array_equal(r.read(["y"])["y"], x * 2)
        np.testing.assert_array_equal(r.map(["x"])["x"], x)
    answer = client.model_prefetch("names-c")
    assert answer["bytes"] == 2 * x.nbytes
    with pytest.raises(cairn.NotFound):
        client.model_prefetch("names-no-such-model")
    path = tmp_path / "m.safetensors"
    client.model_get_file("names-m", path)
    client.model_put_file("names-file", path, durability="memory")
    np.testing.assert_array_equal(client.load_model("names-file", copy=True)["z"], x * 3)


def _deprecated(call, old, new):
    with pytest.warns(DeprecationWarning, match=rf"{old} is deprecated; use {new}") as record:
        result = call()
    assert record[0].filename == __file__  # the warning points at the caller
    return result


def test_deprecated_names_warn_and_still_work(client, tmp_path):
    x = np.arange(8, dtype=np.int32)
    client.tensor_put("names/old", x)
    assert _deprecated(lambda: client.poll_tensor("names/old"), "Client.poll_tensor", "Client.tensor_poll") is True
    _deprecated(lambda: client.delete_tensor("names/old"), "Client.delete_tensor", "Client.tensor_delete")
    assert client.tensor_poll("names/old") is False

    w = _deprecated(lambda: client.writer("names-old"), "Client.writer", "Client.model_create")
    _deprecated(lambda: w.add("a", x), "ModelWriter.add", "ModelWriter.add_tensor")
    _deprecated(lambda: w.add_many({"b": x}), "ModelWriter.add_many", "ModelWriter.add_tensors")
    space = _deprecated(lambda: w.space("c", "I32", (8,)), "ModelWriter.space", "ModelWriter.add_tensor_space")
    space[...] = x
    _deprecated(lambda: w.seal("c"), "ModelWriter.seal", "ModelWriter.seal_tensor")
    w.commit("memory", wait=True)
    with client.model_create("names-old-child", "names-old") as w:
        _deprecated(lambda: w.inherit("a"), "ModelWriter.inherit", "ModelWriter.inherit_tensor")
        w.commit("memory")
    _deprecated(client.flush_pipeline, "Client.flush_pipeline", "Client.pipeline_flush")
    assert _deprecated(lambda: client.in_flight, "Client.in_flight", "Client.pipeline_in_flight") == 0
    with _deprecated(lambda: client.open_model("names-old-child"), "Client.open_model", "Client.model_open") as r:
        np.testing.assert_array_equal(r.read(["a"])["a"], x)
    assert _deprecated(lambda: client.prefetch("names-old"), "Client.prefetch", "Client.model_prefetch") is None
    path = tmp_path / "old.safetensors"
    _deprecated(lambda: client.get_file("names-old", path), "Client.get_file", "Client.model_get_file")
    _deprecated(lambda: client.put_file("names-old-file", path), "Client.put_file", "Client.model_put_file")
    np.testing.assert_array_equal(client.load_model("names-old-file", copy=True)["c"], x)


def test_names_the_design_fixes_do_not_warn(client):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        client.put_tensor("names/fixed", np.ones(3, np.float64))
        np.testing.assert_array_equal(client.get_tensor("names/fixed"), np.ones(3))
        client.save_model("names-fixed", {"w": np.ones(4, np.float32)}, wait=True)
        assert list(client.load_model("names-fixed")) == ["w"]
        client.tensor_delete("names/fixed")
