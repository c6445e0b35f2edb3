"""cairn.torch.load onto a GPU through the daemon's HBM tier (docs/gpu.md): tensors that alias the
daemon's copies in device memory. Needs a GPU: "skipped: no GPU" otherwise."""
import gc

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="skipped: no GPU")

HBM_CUDA = {"CAIRN_TIERS_HBM_CAPACITY": "256MiB", "CAIRN_TIERS_HBM_BACKEND": "cuda", "CAIRN_TIERS_HBM_DEVICES": "0"}


def small():
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


def hbm_device(c):
    return c.stats()["tiers"]["hbm"]["devices"][0]


def test_load_aliases_the_hbm_copy_and_releases_with_the_tensors(make_daemon):
    import cairn
    import cairn.torch as ct

    d = make_daemon(env=HBM_CUDA)
    c = cairn.connect(d.socket)
    try:
        m = small()
        ct.save(m, "gpu/m", client=c)
        want = ct.load("gpu/m", client=c)  # host copies
        sd = ct.load("gpu/m", device="cuda:0", client=c)
        assert all(v.is_cuda and v.device.index == 0 for v in sd.values())
        for name, v in sd.items():
            assert torch.equal(v.cpu(), want[name]), name
        assert c.stats()["tiers"]["hbm"]["misses"] == len(want)
        assert hbm_device(c)["pinned_bytes"] > 0  # leased while the tensors live
        again = ct.load("gpu/m", device="cuda:0", client=c)
        name = next(iter(sd))
        assert again[name].data_ptr() == sd[name].data_ptr()  # the same copy, mapped once
        assert c.stats()["tiers"]["hbm"]["hits"] >= len(want)
        fresh = ct.load("gpu/m", module=small(), device="cuda:0", client=c)
        assert torch.equal(next(fresh.parameters()).cpu(), next(m.parameters()).detach())
        del sd, again, v  # v: the last tensor of the loop above, which holds its reader's leases too
        gc.collect()
        c.stats()  # the next request closes the readers whose tensors are gone
        assert hbm_device(c)["pinned_bytes"] == 0
    finally:
        c.close()
