"""cairn.torch against a real daemon: save with parents (only changed tensors stored), load into
modules, architecture graphs and signatures, transfer from the best stored ancestor, bf16."""
import copy
import os

import numpy as np
import pytest

if os.environ.get("CAIRN_SANITIZED") == "1" and "libasan" not in os.environ.get("LD_PRELOAD", ""):
    pytest.skip("sanitized build: start this Python with LD_PRELOAD as in ctypes_env()", allow_module_level=True)

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import cairn  # noqa: E402
import cairn.torch as ct  # noqa: E402


@torch.no_grad()
def randomize_batchnorm(model, seed):
    """BatchNorm parameters and statistics that differ from a fresh module's (ones, zeros, 0)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.split(".")[-2].startswith("bn"):
            p.copy_(torch.rand(p.shape, generator=g) + 0.5)
    for name, b in model.named_buffers():
        if name.endswith("running_mean"):
            b.copy_(torch.randn(b.shape, generator=g))
        elif name.endswith("running_var"):
            b.copy_(torch.rand(b.shape, generator=g) + 0.5)
        elif name.endswith("num_batches_tracked"):
            b.fill_(7 + seed)


def assert_same_state(got, want):
    got, want = got.state_dict() if isinstance(got, nn.Module) else got, want.state_dict()
    assert list(got) == list(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        assert torch.equal(got[k], want[k]), k


def small(width=16, classes=10):
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
        nn.Conv2d(8, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, classes))


def nbytes(t):
    return t.numel() * t.element_size()


def physical(client):
    return client.stats()["repository"]["physical_bytes"]


# ---- save with a parent, load back ----

def test_resnet18_finetuned_child_costs_only_the_changed_tensors(client):
    torch.manual_seed(0)
    base = torchvision.models.resnet18()
    randomize_batchnorm(base, 0)
    p0 = physical(client)
    t = ct.save(base, "rn/base", meta={"score": 0.5}, client=client)
    assert t.done and t.reached == "global"
    logical = sum(nbytes(v) for v in base.state_dict().values())
    assert 0.9 * logical < physical(client) - p0 <= logical  # everything (equal chunks once)

    # Fine-tune the last layer only (eval mode: the BatchNorm statistics stay as they are).
    ft = copy.deepcopy(base).eval()
    for p in ft.parameters():
        p.requires_grad_(False)
    head = [ft.fc.weight, ft.fc.bias]
    for p in head:
        p.requires_grad_(True)
    opt = torch.optim.SGD(head, lr=0.5)
    for _ in range(2):
        opt.zero_grad()
        F.cross_entropy(ft(torch.randn(2, 3, 64, 64)), torch.tensor([3, 7])).backward()
        opt.step()
    assert not torch.equal(ft.fc.weight, base.fc.weight) and torch.equal(ft.conv1.weight, base.conv1.weight)

    p1 = physical(client)
    ct.save(ft, "rn/ft", parent="rn/base", meta={"score": 0.6}, client=client)
    assert physical(client) - p1 == nbytes(ft.fc.weight) + nbytes(ft.fc.bias) == (512 * 1000 + 1000) * 4
    shown = client.show("rn/ft")
    assert shown["parent"] == "rn/base" and shown["durability"] == "global"
    assert [t["name"] for t in shown["tensors"]] == list(ft.state_dict())  # the state dict's order
    assert list(ct.load("rn/ft", client=client)) == list(ft.state_dict())
    assert shown["architecture"] == ct.architecture(ft)
    assert client.lineage("rn/ft")["ancestors"] == ["rn/base"]

    # Loaded into fresh modules: identical parameters and buffers (num_batches_tracked included).
    assert_same_state(ct.load("rn/ft", module=torchvision.models.resnet18(), client=client), ft)
    assert_same_state(ct.load("rn/base", module=torchvision.models.resnet18(), client=client), base)

    # Saving the same weights again as a child stores nothing.
    p2 = physical(client)
    ct.save(ft, "rn/ft-again", parent="rn/ft", client=client)
    assert physical(client) == p2


def test_save_state_dict_with_parent_inherits_and_reuses_the_parent_graph(client):
    torch.manual_seed(3)
    m = small()
    ct.save(m, "sd/base", client=client)
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    sd["8.bias"] += 1
    p = physical(client)
    ct.save(sd, "sd/child", parent="sd/base", client=client)  # a plain state dict, not a module
    assert physical(client) - p == nbytes(sd["8.bias"])
    assert client.show("sd/child")["architecture"] == client.show("sd/base")["architecture"]
    got = ct.load("sd/child", client=client)
    assert set(got) == set(sd) and all(torch.equal(got[k], sd[k]) for k in sd)


# ---- architecture graphs and signatures ----

def test_architecture_of_independent_identical_modules_is_the_same(client):
    assert ct.architecture(torchvision.models.resnet18()) == ct.architecture(torchvision.models.resnet18())
    a, b, wide = small(16), small(16), small(32)
    ga, gb, gw = ct.architecture(a), ct.architecture(b), ct.architecture(wide)
    assert ga == gb and ga != gw
    names = [layer["name"] for layer in ga["layers"]]
    assert names == ["input", "0", "1", "2", "3", "4", "5", "6", "7", "8"]
    conv = ga["layers"][4]
    assert conv["type"] == "Conv2d" and conv["inputs"] == ["2"]
    assert conv["config"]["out_channels"] == 16 and conv["config"]["bias"] is False
    assert "inplace" not in ga["layers"][3].get("config", {})  # ReLU(inplace=True) == ReLU()

    # The daemon's signatures agree: b matches all of a's layers; the wider one only up to its change.
    ct.save(a, "sig/16", meta={"suite": "sig"}, client=client)
    same = client.best_ancestor(gb, where={"suite": "sig"})
    assert same["model"] == "sig/16" and same["matched"] == len(gb["layers"])
    wider = client.best_ancestor(gw, where={"suite": "sig"})
    assert wider["model"] == "sig/16" and wider["layers"] == ["input", "0", "1", "2"]

    # And transfer loads exactly the first conv and batch norm into the wider module.
    init = {k: v.clone() for k, v in wide.state_dict().items()}
    got = ct.transfer(wide, client=client, where={"suite": "sig"})
    moved = {"0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var", "1.num_batches_tracked"}
    assert got["model"] == "sig/16" and set(got["tensors"]) == moved and got["skipped"] == []
    for k, v in wide.state_dict().items():
        assert torch.equal(v, a.state_dict()[k] if k in moved else init[k]), k


def test_architecture_names_graph_parts_and_falls_back_without_fx(client):
    class Gated(nn.Module):  # data-dependent control flow: torch.fx cannot trace it
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 8)
            self.b = nn.Linear(8, 2)
            self.scale = nn.Parameter(torch.ones(2))

        def forward(self, x):
            h = self.a(x)
            return self.b(h) * self.scale if h.sum() > 0 else self.b(-h)

    g = ct.architecture(Gated())
    assert [(layer["name"], layer["type"]) for layer in g["layers"]] == [
        ("input", "Input"), ("Gated", "Gated"), ("a", "Linear"), ("b", "Linear")]
    assert g["tensors"] == {"scale": "Gated"}
    torch.manual_seed(4)
    src = Gated()
    ct.save(src, "fallback/src", meta={"suite": "fallback"}, client=client)
    dst = Gated()
    got = ct.transfer(dst, client=client, where={"suite": "fallback"})
    assert set(got["tensors"]) == set(src.state_dict())
    assert_same_state(dst, src)

    class Attn(nn.Module):  # nested tensors of a leaf module, a parameter read with get_attr
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(8, 2)
            self.enc = nn.Module()
            self.enc.pos = nn.Parameter(torch.zeros(3, 1, 8))

        def forward(self, x):
            x = x + self.enc.pos
            return self.attn(x, x, x)[0]

    g = ct.architecture(Attn())
    by_name = {layer["name"]: layer for layer in g["layers"]}
    assert by_name["enc.pos"]["type"] == "Attr" and by_name["attn"]["type"] == "MultiheadAttention"
    assert g["tensors"] == {"attn.out_proj.weight": "attn", "attn.out_proj.bias": "attn", "enc.pos": "enc.pos"}
    torch.manual_seed(5)
    src = Attn()
    with torch.no_grad():
        src.enc.pos.normal_()
    ct.save(src, "attn/src", meta={"suite": "attn"}, client=client)
    dst = Attn()
    got = ct.transfer(dst, client=client, where={"suite": "attn"})
    assert set(got["tensors"]) == set(src.state_dict())
    assert_same_state(dst, src)


# ---- transfer ----

def test_transfer_into_resnet34_loads_exactly_the_matching_prefix_of_resnet18(client):
    torch.manual_seed(1)
    r18 = torchvision.models.resnet18()
    randomize_batchnorm(r18, 1)
    ct.save(r18, "xfer/r18", meta={"suite": "xfer", "score": 0.7}, client=client)

    torch.manual_seed(2)
    r34 = torchvision.models.resnet34()
    init = {k: v.clone() for k, v in r34.state_dict().items()}
    got = ct.transfer(r34, client=client, where={"suite": "xfer"})

    expected = {k for k in r34.state_dict() if k.split(".")[0] in ("conv1", "bn1") or k.startswith(("layer1.0.", "layer1.1."))}
    assert len(expected) == 1 + 5 + 2 * (2 + 2 * 5)  # conv1, bn1 (5 tensors), two blocks of 2 convs and 2 batch norms
    assert got["model"] == "xfer/r18" and got["score"] == 0.7 and got["skipped"] == []
    assert set(got["tensors"]) == expected and all(got["tensors"][k] == k for k in expected)
    assert "layer1.1.relu#1" in got["layers"] and not any(n.startswith(("layer1.2", "layer2", "fc")) for n in got["layers"])

    src = r18.state_dict()
    for k, v in r34.state_dict().items():
        if k in expected:
            assert torch.equal(v, src[k]), k
            assert k.endswith("num_batches_tracked") or not torch.equal(v, init[k]), k  # really changed
        else:
            assert torch.equal(v, init[k]), k  # untouched: still its initial value
    # The module still works.
    assert r34.eval()(torch.randn(1, 3, 32, 32)).shape == (1, 1000)


def test_transfer_with_no_stored_match_loads_nothing(client):
    got = ct.transfer(small(), client=client, where={"suite": "nobody-stored-this"})
    assert got["model"] is None and got["tensors"] == {} and got["layers"] == []


# ---- dtypes ----

def test_bf16_state_dict_roundtrip(client):
    torch.manual_seed(6)
    m = small().to(torch.bfloat16)
    ct.save(m, "bf16/base", client=client)
    dtypes = {t["name"]: t["dtype"] for t in client.show("bf16/base")["tensors"]}
    assert dtypes["0.weight"] == "BF16" and dtypes["1.num_batches_tracked"] == "I64"
    got = ct.load("bf16/base", client=client)
    assert got["0.weight"].dtype == torch.bfloat16
    assert_same_state(got, m)

    # A child: the unchanged bf16 tensors are recognised bit for bit.
    with torch.no_grad():
        m[8].weight.add_(1)
    p = physical(client)
    ct.save(m, "bf16/child", parent="bf16/base", client=client)
    assert physical(client) - p == nbytes(m[8].weight)
    assert_same_state(ct.load("bf16/child", module=small().to(torch.bfloat16), client=client), m)

    # Mixed dtypes, a state dict, special values, 0-d and empty tensors.
    sd = {"w": torch.tensor([[1.5, -0.0], [float("nan"), float("inf")]], dtype=torch.bfloat16),
          "h": torch.randn(5).half(), "i": torch.arange(6, dtype=torch.int32).reshape(2, 3)[:, ::2],
          "b": torch.tensor([True, False]), "s": torch.tensor(3), "e": torch.zeros(0, 4, dtype=torch.bfloat16)}
    ct.save(sd, "bf16/mixed", client=client)
    got = ct.load("bf16/mixed", client=client)
    for k, v in sd.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
        if v.dtype == torch.bfloat16:
            assert torch.equal(got[k].view(torch.int16), v.view(torch.int16)), k  # bits: NaN and -0.0 too
        else:
            assert torch.equal(got[k], v), k


# ---- load ----

def test_load_into_a_module_is_strict(client):
    torch.manual_seed(7)
    m = small()
    ct.save(m, "strict/m", client=client)
    fresh = small()
    assert ct.load("strict/m", module=fresh, client=client) is fresh
    assert_same_state(fresh, m)

    with pytest.raises(RuntimeError, match="size mismatch"):
        ct.load("strict/m", module=small(width=32), client=client)
    longer = nn.Sequential(*small(), nn.Linear(10, 2))
    with pytest.raises(RuntimeError, match="Missing key"):
        ct.load("strict/m", module=longer, client=client)
    ct.load("strict/m", module=longer, strict=False, client=client)
    assert torch.equal(longer[0].weight, m[0].weight)
    with pytest.raises(cairn.NotFound):
        ct.load("strict/nothing", module=small(), client=client)

    # The state dict is writable and independent of the daemon and of other loads, with and
    # without a copy.
    for copy_ in (False, True):
        sd = ct.load("strict/m", device="cpu", client=client, copy=copy_)
        assert all(v.device.type == "cpu" for v in sd.values())
        sd["0.weight"].zero_()
        assert torch.equal(ct.load("strict/m", client=client)["0.weight"], m[0].weight)
    assert_same_state(ct.load("strict/m", module=small(), client=client, copy=True), m)
    # read_into: one copy into the caller's arrays; a non-contiguous or read-only array is refused.
    w = np.empty(tuple(m[0].weight.shape), np.float32)
    client.read_into("strict/m", {"0.weight": w})
    assert np.array_equal(w, m[0].weight.detach().numpy())
    with pytest.raises(cairn.InvalidArgument, match="C-contiguous"):
        client.read_into("strict/m", {"0.weight": np.empty((8, 3, 3, 6), np.float32)[..., ::2]})
    with pytest.raises(RuntimeError, match="size mismatch"):
        ct.load("strict/m", module=small(width=32), client=client, copy=True)


def test_a_module_loaded_without_a_copy_trains_and_the_stored_model_stays(client):
    """ct.load into a module gives it copy-on-write views of the daemon's arena (no copy); an
    optimizer step changes the module's weights only, never the stored model or another load."""
    torch.manual_seed(8)
    net = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 10))  # 2 MiB and more: populated views
    ct.save(net, "cow/net", client=client)
    stored = client.load_model("cow/net", copy=True)

    fresh = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 10))
    params = list(fresh.parameters())  # an optimizer built before the load keeps working
    opt = torch.optim.SGD(params, lr=0.5)
    assert ct.load("cow/net", module=fresh, client=client) is fresh
    assert_same_state(fresh, net)
    assert all(a is b for a, b in zip(params, fresh.parameters()))
    other = ct.load("cow/net", client=client)  # a second load shares the daemon's pages

    x, y = torch.randn(64, 512), torch.randint(0, 10, (64,))
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = F.cross_entropy(fresh(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert not torch.equal(fresh[0].weight, net[0].weight)  # the module trained
    now = client.load_model("cow/net", copy=True)
    assert all(np.array_equal(now[k], stored[k]) for k in stored)  # the stored model did not
    assert_same_state(other, net)  # nor did another load of it
    assert_same_state(ct.load("cow/net", client=client), net)

    # Identical tensors of one model are stored once; their views stay independent.
    twins = nn.Sequential(nn.LayerNorm(300), nn.LayerNorm(300), nn.Linear(300, 300, bias=False))
    with torch.no_grad():
        twins[2].weight.fill_(1.0)  # the same bytes as the LayerNorms' weights, repeated
    ct.save(twins, "cow/twins", client=client)
    sd = ct.load("cow/twins", client=client)
    sd["0.weight"].mul_(3)
    sd["1.bias"].add_(1)
    assert torch.equal(sd["1.weight"], torch.ones(300)) and torch.equal(sd["0.bias"], torch.zeros(300))
    assert torch.equal(sd["2.weight"], torch.ones(300, 300))
    loaded = ct.load("cow/twins", module=copy.deepcopy(twins), client=client)
    with torch.no_grad():
        loaded[1].weight.zero_()
    assert torch.equal(loaded[0].weight, torch.ones(300)) and torch.equal(loaded[2].weight, torch.ones(300, 300))
    assert_same_state(ct.load("cow/twins", client=client), twins)

    # Buffers are views too; a module on another dtype is copied into, with the same strictness.
    bn = nn.BatchNorm1d(4)
    randomize = {"weight": torch.rand(4), "bias": torch.rand(4), "running_mean": torch.randn(4),
                 "running_var": torch.rand(4) + 0.5, "num_batches_tracked": torch.tensor(3)}
    bn.load_state_dict(randomize)
    ct.save(bn, "cow/bn", client=client)
    got = ct.load("cow/bn", module=nn.BatchNorm1d(4), client=client)
    assert_same_state(got, bn)
    got.train()
    got(torch.randn(8, 4))
    assert int(got.num_batches_tracked) == 4
    assert int(client.load_model("cow/bn", copy=True)["num_batches_tracked"]) == 3
    half = ct.load("cow/net", module=copy.deepcopy(net).double(), client=client)
    assert half[0].weight.dtype == torch.float64 and torch.equal(half[0].weight, net[0].weight.double())
    with pytest.raises(RuntimeError, match="Unexpected key"):
        ct.load("cow/net", module=nn.Sequential(nn.Linear(512, 1024)), client=client)


def test_default_client_comes_from_CAIRN_SOCKET(daemon, monkeypatch):
    monkeypatch.setenv("CAIRN_SOCKET", daemon.socket)
    monkeypatch.setattr(ct, "_default", None)
    m = nn.Linear(3, 2)
    ct.save(m, "default/m")
    assert ct.default_client().address == daemon.socket
    assert_same_state(ct.load("default/m"), m)
    ct.default_client().close()


def test_refuses_what_it_cannot_store(client):
    with pytest.raises(cairn.InvalidArgument, match="not a tensor"):
        ct.save({"w": torch.ones(2), "step": 3}, "bad/step", client=client)
    with pytest.raises(cairn.InvalidArgument, match="complex"):
        ct.save({"z": torch.ones(2, dtype=torch.complex64)}, "bad/complex", client=client)
    assert not any(m["id"].startswith("bad/") for m in client.list())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_load_onto_cuda(client):
    torch.manual_seed(8)
    m = small()
    ct.save(m, "cuda/m", client=client)
    sd = ct.load("cuda/m", device="cuda", client=client)
    assert all(v.is_cuda for v in sd.values())
    assert all(torch.equal(sd[k].cpu(), v) for k, v in m.state_dict().items())
    fresh = ct.load("cuda/m", module=small(), device="cuda", client=client)
    assert next(fresh.parameters()).is_cuda
    assert_same_state({k: v.cpu() for k, v in fresh.state_dict().items()}, m)


# ---- checkpoints copied in the background (save_sharded(background=True)) ----

class OneRank:
    """The communicator of a one-rank job (what save_sharded asks of it with one rank)."""

    def Get_rank(self):
        return 0

    def Get_size(self):
        return 1


def test_background_checkpoint_overlaps_a_training_step_and_stores_the_weights_before_it(client):
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    snap = ct.save_sharded(model, "bg-step", OneRank(), client=client, durability="local", background=True,
                           optimizer=opt)
    assert isinstance(snap, ct.Snapshot) and snap.model_id == "bg-step"
    loss = F.cross_entropy(model(torch.randn(32, 256)), torch.randint(0, 10, (32,)))
    loss.backward()  # reads the weights only: overlaps the copy
    opt.step()  # waits for the copy first (the hook), then changes the weights
    assert snap.copied and "step" not in vars(opt)  # the hook removed itself
    assert snap.wait(timeout=60) == "local" and snap.done and snap.copy_seconds is not None
    stored = ct.load("bg-step", client=client, copy=True)
    assert list(stored) == list(before)
    for k in before:
        assert torch.equal(stored[k], before[k]), k
    assert not torch.equal(model.state_dict()["0.weight"], before["0.weight"])  # the step did happen
    opt.step()  # later steps are the optimizer's own again
    with torch.no_grad():
        model[0].weight.add_(1.0)
    assert torch.equal(ct.load("bg-step", client=client, copy=True)["0.weight"], before["0.weight"])


def test_background_checkpoint_of_weights_changed_during_the_copy_fails_and_stores_nothing(client):
    model = nn.Linear(64, 64)
    # The background copy needs the client's connection: holding it keeps the copy from starting
    # until the weight has changed, so the change is always caught.
    with client._conn.op():
        snap = ct.save_sharded(model, "bg-changed", OneRank(), client=client, background=True)
        with torch.no_grad():
            model.weight.mul_(2.0)  # too early: the copy did not happen yet
        assert not snap.copied and snap.reached == "copying"
    with pytest.raises(cairn.InvalidArgument, match="'weight' changed while the background checkpoint copied it"):
        snap.wait_copied(timeout=60)
    with pytest.raises(cairn.InvalidArgument):
        snap.wait(timeout=60)
    assert snap.reached == "failed" and snap.done
    with pytest.raises(cairn.NotFound):
        client.show("bg-changed")
    # The id is free: a checkpoint taken properly goes through.
    ct.save_sharded(model, "bg-changed", OneRank(), client=client, background=True).wait(timeout=60)
    assert torch.equal(ct.load("bg-changed", client=client, copy=True)["weight"], model.weight.detach())
