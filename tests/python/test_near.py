"""Near-data feature extraction (docs/near.md) against a real cairnd that starts a real compute worker
(python -m cairn.near_worker): datasets, activations equal to a local forward pass, the same loss
curve with and without pushdown, the activation cache shared by models with the same frozen prefix,
a worker killed mid-request, the cost model and the wire format's rejection of garbage."""
import os
import random
import signal
import socket
import sys
import time
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

import cairn  # noqa: E402
import cairn.data as cdata  # noqa: E402
import cairn.near as near  # noqa: E402
from cairn import _near_wire as wire  # noqa: E402

COMPUTE = f"compute:\n  enabled: true\n  python: {sys.executable}\n  listen: 127.0.0.1:0\n  start_timeout: 120s\n"
SHAPE = (3, 32, 32)


def _resnet(seed=0, classes=10):
    torch.manual_seed(seed)
    return torchvision.models.resnet18(num_classes=classes).eval()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """A daemon with the compute worker enabled, a 4-shard image set and a ResNet-18 whose first 10
    layers (through the flatten) are frozen."""
    from conftest import Daemon  # noqa: PLC0415

    root = tmp_path_factory.mktemp("near")
    (root / "d").mkdir()
    d = Daemon(root / "d", dram="512MiB", extra_config=COMPUTE, env={"CAIRN_COMPUTE_THREADS": "1", "CAIRN_NEAR_SWEEP_S": "0"}).start()
    c = cairn.connect(d.socket)
    cdata.save("imgs", cdata.synthetic_images(96, 24, SHAPE, seed=1), client=c)
    m = _resnet()
    near.save(m, "r18", frozen=10, builder="torchvision.models:resnet18", kwargs={"num_classes": 10}, client=c)
    yield d, c, m
    c.close()
    assert d.stop() == 0


def _local(m, c, split, shard):
    x, _ = cdata.read_shard(c, "imgs", shard, labels=False)
    return near.run_layers(near.layers(m)[:split], near.preprocess(torch.from_numpy(np.array(x)), near.DEFAULT_PREP))


def test_dataset_round_trip_and_zero_copy(stack):
    d, c, _ = stack
    shards = list(cdata.synthetic_images(96, 24, SHAPE, seed=1))
    info = cdata.info("imgs", c)
    assert info["shards"] == 4 and info["samples"] == 96 and info["x"] == {"dtype": "|u1", "shape": list(SHAPE)}
    ds = cdata.Dataset("imgs", client=c)
    assert len(ds) == 96
    x, y = ds[30]
    assert torch.equal(x, torch.from_numpy(shards[1][0][6])) and int(y) == int(shards[1][1][6])
    assert ds.locate(-1) == (3, 23)
    with pytest.raises(IndexError):
        ds[96]
    arr, _ = cdata.read_shard(c, "imgs", 2)
    assert not arr.flags.writeable and not arr.flags.owndata  # a view of the arena, no copy
    got = list(cdata.ShardDataset("imgs", client=c, shards=[3, 0]))
    assert torch.equal(got[0][0], torch.from_numpy(shards[3][0])) and torch.equal(got[1][1], torch.from_numpy(shards[0][1]))
    # Through torch's DataLoader: map-style batches of samples, and whole shards from the iterable.
    loader = torch.utils.data.DataLoader(ds, batch_size=32, shuffle=False)
    xb, yb = next(iter(loader))
    assert xb.shape == (32, *SHAPE) and torch.equal(xb[30], torch.from_numpy(shards[1][0][6]))
    whole = list(torch.utils.data.DataLoader(cdata.ShardDataset("imgs", client=c), batch_size=None))
    assert len(whole) == 4 and torch.equal(whole[2][0], torch.from_numpy(shards[2][0]))
    with pytest.raises(ValueError, match="not a cairn dataset"):
        cdata.info("r18", c)
    with pytest.raises(ValueError, match="shard 1: inputs of"):
        cdata.save("bad", [(np.zeros((2, 3), np.uint8), None), (np.zeros((2, 4), np.uint8), None)], client=c)


def test_compute_off_is_a_clear_error(make_daemon):
    d = make_daemon()
    with cairn.connect(d.socket) as c:
        with pytest.raises(cairn.Unavailable, match="compute.enabled"):
            c._request({"op": "compute"})
        assert c.stats()["compute"]["enabled"] is False
    assert "compute: off (compute.enabled: false)" in d.cairn("stats").stdout


def test_features_equal_a_local_forward_pass_over_the_arena_and_over_tcp(stack):
    d, c, m = stack
    for split in (0, 4, 10):
        stream = near.features("r18", "imgs", split=split, client=c, module=m)
        assert stream.local
        got = list(stream)
        assert len(got) == 4
        for s, (a, y) in enumerate(got):
            assert torch.allclose(a, _local(m, c, split, s), rtol=1e-5, atol=1e-5)
            assert y.dtype == torch.int64 and y.shape == (24,)
    listen = c.stats()["compute"]["listen"]
    assert listen.startswith("127.0.0.1:")
    stream = near.features("r18", "imgs", split=7, client=c, module=m, address=listen, batch=40)
    got = list(stream)
    assert [a.shape[0] for a, _ in got] == [40, 40, 16]
    want = torch.cat([_local(m, c, 7, s) for s in range(4)])
    assert torch.allclose(torch.cat([a for a, _ in got]), want, rtol=1e-5, atol=1e-5)
    assert stream.stats["bytes"] == sum(a.numel() * 4 + 8 * a.shape[0] for a, _ in got)
    with pytest.raises(ValueError, match="frozen layers"):
        near.features("r18", "imgs", split=11, client=c, module=m)


def _train(c, m, split, seed, epochs=2):
    torch.manual_seed(seed)
    frozen_ls = near.layers(m)
    head = torch.nn.Linear(512, 10)
    head.load_state_dict(m.fc.state_dict())
    opt = torch.optim.SGD(head.parameters(), lr=0.05)
    losses = []
    for _ in range(epochs):
        stream = near.features("r18", "imgs", split=split, client=c, module=m)
        rest = torch.nn.Sequential(*frozen_ls[split:10]).eval()
        for a, y in stream:
            with torch.no_grad():
                f = rest(a)
            loss = torch.nn.functional.cross_entropy(head(f), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses


def test_head_fine_tuning_gives_the_same_loss_curve_with_and_without_pushdown(stack):
    d, c, m = stack
    vanilla = _train(c, m, 0, seed=5)
    pushed = _train(c, m, 10, seed=5)
    assert len(vanilla) == 8
    np.testing.assert_allclose(pushed, vanilla, rtol=1e-4, atol=1e-5)
    assert vanilla[-1] < vanilla[0]  # it learns something


def test_models_sharing_the_frozen_prefix_share_cached_activations(stack):
    d, c, m = stack
    before = near.worker_stats(client=c)
    # Two children of r18 with new heads: same frozen prefix, so the same signatures.
    for i in range(2):
        child = _resnet()
        child.load_state_dict(m.state_dict())
        torch.manual_seed(100 + i)
        child.fc = torch.nn.Linear(512, 10)
        near.save(child, f"r18-head{i}", frozen=10, builder="torchvision.models:resnet18",
                  kwargs={"num_classes": 10}, client=c, parent="r18")
        assert near.spec_of(c, f"r18-head{i}")["signatures"] == near.spec_of(c, "r18")["signatures"]
    a0 = [a for a, _ in near.features("r18-head0", "imgs", split=9, client=c)]
    s0 = near.features("r18-head1", "imgs", split=9, client=c)
    a1 = [a for a, _ in s0]
    assert s0.stats["cached"] == 4 and s0.stats["computed"] == 0
    assert all(torch.equal(x, y) for x, y in zip(a0, a1))
    after = near.worker_stats(client=c)
    sig = near.spec_of(c, "r18")["signatures"][9][:20]
    counts = {k: v for k, v in after["forward"].items() if k.startswith(sig)}
    assert len(counts) == 4 and set(counts.values()) == {1}  # once per shard and prefix
    hits = after["counters"].get("cache_hits", 0) - before["counters"].get("cache_hits", 0)
    assert hits >= 4


def test_a_worker_killed_mid_request_makes_the_client_run_every_layer(stack):
    d, c, m = stack
    info = c._request({"op": "compute"})
    stream = near.features("r18", "imgs", split=6, client=c, module=m, depth=1)
    it = iter(stream)
    first, _ = next(it)
    os.kill(info["pid"], signal.SIGKILL)
    with pytest.warns(RuntimeWarning, match="running every layer here"):
        rest = list(it)
    assert len(rest) == 3 and stream.stats["fallback"] and stream.stats["local"] >= 1
    for s, (a, _) in enumerate([(first, None)] + rest):
        assert torch.allclose(a, _local(m, c, 6, s), rtol=1e-5, atol=1e-5)
    again = c._request({"op": "compute"})  # the next request starts a new worker
    assert again["pid"] != info["pid"] and again["started"]
    assert len(list(near.features("r18", "imgs", split=6, client=c, module=m))) == 4


def test_auto_split_profiles_both_sides(stack):
    d, c, m = stack
    listen = c.stats()["compute"]["listen"]
    stream = near.features("r18", "imgs", split="auto", client=c, module=m, address=listen)
    assert stream.plan is not None and 0 <= stream.split <= 10
    assert stream.plan.bandwidth > 0 and len(stream.plan.table) == 11
    assert len(list(stream)) == 4
    # A second trainer process (here: the client's own profile cache emptied) gets the worker's
    # measurements without another pass; only which splits are cached is asked again.
    profiles = near.worker_stats(client=c)["counters"]["profiles"]
    near._profiles.clear()
    again = near.features("r18", "imgs", split="auto", client=c, module=m, address=listen)
    assert again.plan is not None and near.worker_stats(client=c)["counters"]["profiles"] == profiles
    again.close()
    pid = c.stats()["compute"]["pid"]
    assert f"compute: worker pid {pid} on {d.socket}.compute and {listen}" in d.cairn("stats").stdout


def test_cost_model():
    base = dict(worker=[1e-3] * 4, trainer=[1e-3] * 4, head=1e-4, mem_fixed=[0, 10, 20, 30, 40],
                mem_per_sample=[0, 100, 100, 100, 100], memory=1 << 30, frozen=4)
    # 1 Gbit/s and big raw inputs: ship activations; split 3 balances the worker (3 ms) against
    # the trainer (1.1 ms) and the link (0.4 ms) better than split 4 (4 ms of worker time).
    slow = near.choose_split(out_bytes=[150_000, 800_000, 400_000, 50_000, 8_000], bandwidth=125e6, **base)
    assert slow.split == 3 and abs(slow.estimate - 3e-3) < 1e-12
    assert [round(r["estimate_s"], 6) for r in slow.table] == [0.0041, 0.0064, 0.0032, 0.003, 0.004]
    # At 10 Mbit/s the link dominates: the fewest bytes win.
    assert near.choose_split(out_bytes=[150_000, 800_000, 400_000, 50_000, 8_000], bandwidth=1.25e6, **base).split == 4
    # Cached activations cost no worker time: chosen even when the worker is slow.
    b2 = dict(base, worker=[1.0] * 4)
    assert near.choose_split(out_bytes=[1000] * 5, bandwidth=1e12, cached=[False, False, False, True, False],
                             **b2).split == 3
    # The memory budget rules out splits whose prefix does not fit a sample.
    b3 = dict(base, mem_per_sample=[0, 5, 5, 50, 50], memory=40)
    assert near.choose_split(out_bytes=[150_000, 800_000, 400_000, 50_000, 8_000], bandwidth=125e6, **b3).split == 2
    # A slow worker and a fast link: vanilla.
    b4 = dict(base, worker=[1.0] * 4)
    assert near.choose_split(out_bytes=[1000] * 5, bandwidth=1e12, **b4).split == 0
    # Told 5 epochs, the cost model weighs in the cache: computing split 4 once and reading it four
    # times beats split 3's balance (per epoch: (4 + 4 x 0.1) / 5 ms against (3 + 4 x 1.1) / 5 ms).
    many = near.choose_split(out_bytes=[150_000, 800_000, 400_000, 50_000, 8_000], bandwidth=125e6, epochs=5, **base)
    assert many.split == 4 and abs(many.estimate - (4e-3 + 4 * 1e-4) / 5) < 1e-12
    # ... unless the activations would not fit the cache: then every epoch pays the worker again.
    assert near.choose_split(out_bytes=[150_000, 800_000, 400_000, 50_000, 8_000], bandwidth=125e6, epochs=5,
                             samples=1000, cache_bytes=1_000_000, **base).split == 3
    assert near.worker_batch(memory=1000, free=10_000, fixed=100, per_sample=30, cap=64) == 30
    # Told 5 epochs, the cost model weighs in the cache: computing split 4 once and reading it four
    # times beats split 3's balance (per epoch: (4 + 4 x 0.1) / 5 ms against (3 + 4 x 1.1) / 5 ms).
    many = near.choose_split(out_bytes=[150_000, 800_000, 400_000, 50_000, 8_000], bandwidth=125e6, epochs=5, **base)
    assert many.split == 4 and abs(many.estimate - (4e-3 + 4 * 1e-4) / 5) < 1e-12
    # ... unless the activations would not fit the cache: then every epoch pays the worker again.
    assert near.choose_split(out_bytes=[150_000, 800_000, 400_000, 50_000, 8_000], bandwidth=125e6, epochs=5,
                             samples=1000, cache_bytes=1_000_000, **base).split == 3
    assert near.worker_batch(memory=1000, free=10_000, fixed=2000, per_sample=30, cap=64) == 1


def test_wire_rejects_garbage_with_a_reason():
    h, p, rest = wire.parse(wire.encode({"op": "x"}, 3) + b"abcdef")
    assert h["op"] == "x" and p == b"abc" and rest == b"def"
    def framed(body, extra=b""):
        return len(body).to_bytes(4, "big") + body + extra

    for bad, why in [(b"\x00\x00", "shorter"), (b"\x00\x00\x00\x00", "outside"), (b"\xff\xff\xff\xff", "outside"),
                     (framed(b"[1,2]"), "not an object"), (framed(b"{a}"), "not JSON"), (framed(b"\xff{}"), "not UTF-8"),
                     (framed(b'{"nbytes":-1}'), "non-negative"), (framed(b'{"nbytes":true}'), "non-negative"),
                     (framed(b'{"nbytes":99999999999999}'), "over the limit"), (framed(b'{"nbytes"')[:-2], "cut off"),
                     (framed(b'{"nbytes":9}', b"ab"), "cut off")]:
        with pytest.raises(wire.ProtocolError, match=why):
            wire.parse(bad)
    rng = random.Random(7)
    good = wire.encode({"op": "features", "shards": [1, 2]}, 4) + b"wxyz"
    for _ in range(3000):  # mutated frames: a clean ProtocolError or a frame, never anything else
        b = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        try:
            wire.parse(bytes(b[:rng.randint(0, len(b))]))
        except wire.ProtocolError:
            pass


def test_the_worker_answers_garbage_with_an_error_and_lives_on(stack):
    d, c, _ = stack
    path = c._request({"op": "compute"})["socket"]
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.sendall(b"\x00\x00\x00\x04nope")
    h, _ = wire.recv(s)
    assert "not JSON" in h["error"]
    s.close()
    with pytest.raises(near.NearError, match="unknown near-data request op"):
        near.request(path, {"op": "launch"})
    with pytest.raises(near.NearError, match="missing field"):
        near.request(path, {"op": "profile"})
    assert near.request(path, {"op": "hello"})["pid"] > 0


def test_dropped_activations_are_computed_again(stack):
    d, c, m = stack
    list(near.features("r18", "imgs", split=8, client=c, module=m))
    again = near.features("r18", "imgs", split=8, client=c, module=m)
    first = [a for a, _ in again]
    assert again.stats["cached"] == 4
    assert near.drop_cache(client=c) >= 4
    s = near.features("r18", "imgs", split=8, client=c, module=m)
    second = [a for a, _ in s]
    assert s.stats["computed"] == 4 and s.stats["cached"] == 0
    assert all(torch.equal(x, y) for x, y in zip(first, second))
    sig = near.spec_of(c, "r18")["signatures"][8][:20]
    live = [x["id"] for x in c.list() if x["id"].startswith("cairn-act-" + sig)]
    assert len(live) == 4  # the new generation only: the dropped models are removed


def test_activations_go_when_no_live_model_has_their_prefix(stack):
    d, c, _ = stack
    other = _resnet(seed=9)  # other weights: other signatures
    near.save(other, "r18-other", frozen=10, builder="torchvision.models:resnet18", kwargs={"num_classes": 10},
              client=c)
    sig = near.spec_of(c, "r18-other")["signatures"][5][:20]
    list(near.features("r18-other", "imgs", split=5, client=c, module=other))

    def acts():
        return [x["id"] for x in c.list() if x["id"].startswith("cairn-act-" + sig)]

    assert len(acts()) == 4
    c.remove("r18-other")
    list(near.features("r18", "imgs", split=0, client=c))  # any request sweeps
    assert acts() == []
    # Those of a prefix a live model still has stay.
    assert [x for x in c.list() if x["id"].startswith("cairn-act-")]
