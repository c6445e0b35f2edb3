"""bench/workloads/peers_sim.py: the ensemble-load simulation (cairn's peer group vs every node
reading the PFS). Pure Python, no daemon; small models keep the 4,096-node runs to a second or two."""
import importlib.util
import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("peers_sim", ROOT / "bench" / "workloads" / "peers_sim.py")
ps = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ps)

MiB = 1 << 20


def params(**kw):
    p = dict(ps.DEFAULTS)
    p.update(kw)
    return p


@pytest.mark.parametrize("dispatch", ["late", "eager"])
@pytest.mark.parametrize("order", ["sequential", "rotated"])
@pytest.mark.parametrize("n", [1, 2, 3, 17, 100, 300])
def test_each_chunk_read_from_pfs_once(n, dispatch, order):
    # A model that is not a multiple of the chunk: the last chunk is short.
    p = params(model_bytes=5 * 16 * MiB + 12345, dispatch=dispatch, order=order)
    r = ps.cairn(p, n)
    assert r["chunks"] == 6
    assert r["pfs_bytes"] == p["model_bytes"]
    assert r["net_bytes"] == (n - 1) * p["model_bytes"]
    assert r["time_s"] > 0


def test_one_node_is_the_baseline():
    for kw in ({}, {"pfs_per_client_Bps": 5e8}, {"model_bytes": 3 * 16 * MiB}):
        p = params(**kw)
        b, c = ps.baseline(p, 1), ps.cairn(p, 1)["time_s"]
        assert b == pytest.approx(p["model_bytes"] / min(p["pfs_per_client_Bps"], p["pfs_aggregate_Bps"]))
        # cairn alone pays only its lookups (window 4 hides most of them).
        assert c >= b * (1 - 1e-9) and c == pytest.approx(b, rel=0.02)


def test_baseline_is_fair_share():
    p = params(pfs_aggregate_Bps=10e9, pfs_per_client_Bps=2e9)
    assert ps.baseline(p, 4) == pytest.approx(p["model_bytes"] / 2e9)  # per-client cap
    assert ps.baseline(p, 100) == pytest.approx(100 * p["model_bytes"] / 10e9)  # aggregate shared


def test_fast_pfs_and_slow_link_baseline_wins():
    # The model is not rigged: when the PFS serves everyone at full client speed and the network is
    # slow, reading the PFS on every node beats fetching chunks from peers.
    p = params(model_bytes=4 * 16 * MiB, pfs_aggregate_Bps=1e15, link_Bps=1e8, nodes=[16, 64])
    for r in ps.simulate(p)["results"]:
        assert r["cairn_s"] > 5 * r["baseline_s"]
        # And cairn can never beat the receivers' links.
        assert r["cairn_s"] >= p["model_bytes"] / p["link_Bps"]


def test_cairn_grows_logarithmically_baseline_linearly():
    p = params(model_bytes=8 * 16 * MiB, pfs_aggregate_Bps=10e9, nodes=[256, 4096])
    small, big = ps.simulate(p)["results"]
    assert big["cairn_s"] / small["cairn_s"] < 2
    assert big["baseline_s"] / small["baseline_s"] > 8
    assert big["ratio"] < 0.01


def test_one_chunk_spreads_as_a_tree():
    # One chunk, link-bound: each doubling of N adds about one transfer time (log2 N depth), where a
    # star (one holder serving everyone) would double the time.
    chunk, link = 16 * MiB, 1e9
    p = params(model_bytes=chunk, link_Bps=link, nodes=[64, 256, 1024, 4096])
    t = [r["cairn_s"] for r in ps.simulate(p)["results"]]
    transfer = chunk / link
    for a, b in zip(t, t[1:]):  # N x4: two levels more
        assert 1.5 * transfer < b - a < 2.6 * transfer
    assert t[-1] < (math.log2(4096) + 2) * transfer + chunk / p["pfs_per_client_Bps"]


def test_eager_directory_does_not_fan_out():
    # directory.hpp as written binds every waiter to the first holder: time grows ~linearly in N.
    p = params(model_bytes=8 * 16 * MiB, dispatch="eager", nodes=[64, 1024])
    small, big = ps.simulate(p)["results"]
    assert big["cairn_s"] / small["cairn_s"] > 8
    late = ps.simulate(params(model_bytes=8 * 16 * MiB, nodes=[1024]))["results"][0]
    assert late["cairn_s"] < big["cairn_s"] / 10


def test_deterministic():
    p = params(model_bytes=6 * 16 * MiB + 7, nodes=[1, 16, 200])
    a, b = ps.simulate(p), ps.simulate(dict(p))
    assert a == b
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_cli_params_and_json(tmp_path, capsys):
    pj = tmp_path / "params.json"
    pj.write_text(json.dumps({"nodes": [2, 8], "model_bytes": 3 * 16 * MiB, "link_Bps": 5e9}))
    out = tmp_path / "out.json"
    assert ps.main(["--params", str(pj), "--json", str(out), "--window", "2"]) == 0
    d = json.loads(out.read_text())
    assert d["params"]["window"] == 2 and d["params"]["link_Bps"] == 5e9
    assert [r["nodes"] for r in d["results"]] == [2, 8]
    for r in d["results"]:
        assert r["pfs_bytes_cairn"] == 3 * 16 * MiB
        assert r["ratio"] == pytest.approx(r["cairn_s"] / r["baseline_s"])
        assert r["cairn_vs_single"] == pytest.approx(r["cairn_s"] / r["single_node_s"])
    assert "baseline s" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"no_such": 1}))
    with pytest.raises(SystemExit):
        ps.main(["--params", str(bad)])
