"""cairn.torch with CUDA tensors (docs/gpu.md): loads into CUDA modules, two processes sharing the
daemon's one device copy, and checkpoints taken straight from GPU memory, all byte for byte, with
and without an HBM tier. Needs a GPU: "skipped: no GPU" otherwise."""
import gc
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="skipped: no GPU")

HBM_CUDA = {"CAIRN_TIERS_HBM_CAPACITY": "512MiB", "CAIRN_TIERS_HBM_BACKEND": "cuda", "CAIRN_TIERS_HBM_DEVICES": "0"}
TIERS = {"no_hbm": {}, "hbm": HBM_CUDA}


def model():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Embedding(1000, 96), torch.nn.Linear(96, 384), torch.nn.GELU(),
                               torch.nn.LayerNorm(384), torch.nn.Linear(384, 10))


def bits(t):
    """A tensor's bytes on the host, as unsigned integers (bitwise: NaNs, -0.0, bf16 alike)."""
    t = t.detach().contiguous().cpu()
    return t.view(torch.uint8).reshape(-1) if t.numel() else t.reshape(-1).view(torch.uint8)


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


@pytest.mark.parametrize("tier", sorted(TIERS))
def test_load_into_a_cuda_module_is_exact(make_daemon, tier):
    import cairn
    import cairn.torch as ct

    d = make_daemon(env=TIERS[tier])
    c = cairn.connect(d.socket)
    try:
        m = model()
        ct.save(m, "cuda/module", client=c)
        fresh = torch.nn.Sequential(torch.nn.Embedding(1000, 96), torch.nn.Linear(96, 384), torch.nn.GELU(),
                                    torch.nn.LayerNorm(384), torch.nn.Linear(384, 10)).to("cuda:0")
        got = ct.load("cuda/module", module=fresh, device="cuda:0", client=c)
        want = m.state_dict()
        for name, v in got.state_dict().items():
            assert v.is_cuda, name
            assert same(v, want[name]), name
        x = torch.randint(0, 1000, (4, 7))
        assert torch.equal(got(x.to("cuda:0")).cpu(), m.to("cuda:0")(x.to("cuda:0")).cpu())
    finally:
        c.close()


SECOND_PROCESS = r"""
import hashlib, json, sys
import torch, cairn, cairn.torch as ct
c = cairn.connect(sys.argv[1])
sd = ct.load("cuda/shared", device="cuda:0", client=c)
print(json.dumps({k: hashlib.sha256(v.contiguous().cpu().view(torch.uint8).numpy().tobytes()).hexdigest()
                  for k, v in sd.items()}), flush=True)
sys.stdin.readline()  # hold the device leases until the test says so
"""


def test_two_processes_share_one_device_copy(make_daemon):
    import hashlib

    import cairn
    import cairn.torch as ct

    d = make_daemon(env=HBM_CUDA)
    c = cairn.connect(d.socket)
    other = None
    try:
        m = model()
        ct.save(m, "cuda/shared", client=c)
        n = len(m.state_dict())
        mine = ct.load("cuda/shared", device="cuda:0", client=c)
        other = subprocess.Popen([sys.executable, "-c", SECOND_PROCESS, d.socket], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
        line = other.stdout.readline()
        assert line, other.stderr.read()
        theirs = json.loads(line)
        for k, v in m.state_dict().items():
            want = hashlib.sha256(bits(v).numpy().tobytes()).hexdigest()
            assert theirs[k] == want, k
            assert same(mine[k], v), k
        hbm = c.stats()["tiers"]["hbm"]
        dev = hbm["devices"][0]
        assert hbm["misses"] == n, hbm  # promoted once ...
        assert hbm["hits"] >= n, hbm  # ... and the second process mapped the same copies
        assert dev["entries"] == n, dev  # one copy on the device for both processes
        assert dev["pinned_bytes"] > 0
        other.stdin.write("\n")
        other.stdin.flush()
        assert other.wait(timeout=60) == 0, other.stderr.read()
        other = None
        del mine
        gc.collect()
        c.stats()  # the next request closes the readers whose tensors are gone
        assert c.stats()["tiers"]["hbm"]["devices"][0]["pinned_bytes"] == 0
    finally:
        if other is not None:
            other.kill()
            other.wait()
        c.close()


def gpu_state():
    g = torch.Generator(device="cuda:0").manual_seed(5)
    base = torch.randn(512, 384, device="cuda:0", generator=g)
    return {
        "f32": base,
        "bf16": torch.randn(300, 257, device="cuda:0", generator=g).to(torch.bfloat16),
        "f16": torch.randn(1025, device="cuda:0", generator=g).half(),
        "i64": torch.randint(-2**40, 2**40, (999,), device="cuda:0", generator=g),
        "transposed": base[:, :200].t(),  # not contiguous
        "nan_and_negzero": torch.tensor([float("nan"), -0.0, float("inf")], device="cuda:0"),
        "empty": torch.empty(0, 4, device="cuda:0"),
    }


@pytest.mark.parametrize("tier", sorted(TIERS))
def test_checkpoint_from_gpu_tensors_is_exact_and_owns_its_bytes(make_daemon, tier):
    import cairn
    import cairn.torch as ct

    d = make_daemon(env=TIERS[tier])
    c = cairn.connect(d.socket)
    try:
        sd = gpu_state()
        want = {k: v.detach().cpu().clone() for k, v in sd.items()}
        ticket = ct.save(sd, "cuda/ckpt", client=c, durability="memory", pipelined=True, wait=False)
        # The call has returned: the bytes are in the daemon's arena, the GPU buffers are the caller's again.
        for v in sd.values():
            if v.numel() and v.is_floating_point():
                v.zero_()
            elif v.numel():
                v.fill_(7)
        torch.cuda.synchronize()
        ticket.wait()
        got = ct.load("cuda/ckpt", client=c, copy=True)
        assert list(got) == list(want)
        for k, v in want.items():
            assert same(got[k], v), k
        again = ct.load("cuda/ckpt", device="cuda:0", client=c)
        for k, v in want.items():
            assert again[k].is_cuda and same(again[k], v), k
    finally:
        c.close()


def test_checkpoint_from_gpu_inherits_what_the_parent_has(make_daemon):
    import cairn
    import cairn.torch as ct

    d = make_daemon(env=HBM_CUDA)
    c = cairn.connect(d.socket)
    try:
        sd = gpu_state()
        ct.save(sd, "cuda/p", client=c)
        sd["f32"] = sd["f32"] + 1
        ct.save(sd, "cuda/c", parent="cuda/p", client=c)
        shown = {t["name"]: t for t in c.show("cuda/c")["tensors"]}
        assert len(shown) == len(sd)
        got = ct.load("cuda/c", client=c, copy=True)
        for k, v in sd.items():
            assert same(got[k], v), k
        stats = c.stats()["repository"]
        assert stats["physical_bytes"] < stats["logical_bytes"]  # the unchanged tensors stored once
    finally:
        c.close()
