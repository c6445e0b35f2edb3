"""Shared tensors are stored once; a derived model costs about the tensors it changed."""
import numpy as np

from stfiles import rand, save_file


def test_derived_model_costs_only_the_changed_tensor(daemon, tmp):
    rng = np.random.default_rng(10)
    base = {f"block{i}.conv.weight": rand(rng, (256, 256, 3, 3), np.float32) for i in range(4)}  # 2.25 MiB each
    base["fc.weight"] = rand(rng, (1000, 512), np.float32)
    save_file(base, str(tmp / "base.safetensors"))
    daemon.cairn("put", "base", tmp / "base.safetensors")
    s0 = daemon.stats()["repository"]
    logical_base = sum(v.nbytes for v in base.values())
    assert s0["logical_bytes"] == logical_base
    assert s0["physical_bytes"] == logical_base

    changed = dict(base)
    changed["block2.conv.weight"] = rand(rng, (256, 256, 3, 3), np.float32)
    save_file(changed, str(tmp / "child.safetensors"))
    daemon.cairn("put", "child", tmp / "child.safetensors", "--parent", "base")
    s1 = daemon.stats()["repository"]
    assert s1["logical_bytes"] == 2 * logical_base
    assert s1["physical_bytes"] - s0["physical_bytes"] == changed["block2.conv.weight"].nbytes

    # The same bytes under another id and no parent: nothing new at all.
    daemon.cairn("put", "copy", tmp / "child.safetensors")
    assert daemon.stats()["repository"]["physical_bytes"] == s1["physical_bytes"]
