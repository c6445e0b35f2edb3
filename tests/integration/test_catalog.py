"""The catalog through a real cairnd and the `cairn` tool: best-ancestor matches (`cairn match`),
lineage as Graphviz text and as pictures the tool draws (SVG, PNG), query errors, the index rebuilt after kill -9, and rm + gc + fsck: physical
bytes and disk blocks fall by what only retired models used, live models stay exact, and kill -9 in
the middle of gc loses nothing live."""
import json
import os
import random
import signal
import subprocess
import time
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from conftest import CAIRN
from stfiles import rand, save_file


def conv_graph(widths, head=10, prefix=""):
    """A chain stem -> conv blocks -> fc, one tensor per layer named '<layer>.weight'."""
    layers = [{"name": prefix + "stem", "type": "Conv2d", "config": {"out_channels": 16, "kernel_size": 3}, "inputs": []}]
    prev = prefix + "stem"
    for i, w in enumerate(widths):
        name = f"{prefix}block{i}"
        layers.append({"name": name, "type": "Conv2d", "config": {"out_channels": w, "kernel_size": 3}, "inputs": [prev]})
        layers.append({"name": name + "_bn", "type": "BatchNorm2d", "config": {"num_features": w}, "inputs": [name]})
        layers.append({"name": name + "_relu", "type": "ReLU", "inputs": [name + "_bn"]})
        prev = name + "_relu"
    layers.append({"name": prefix + "fc", "type": "Linear", "config": {"out_features": head}, "inputs": [prev]})
    return {"layers": layers}


def tensors_for(graph, rng):
    return {l["name"] + ".weight": rand(rng, (64, 64), np.float32)
            for l in graph["layers"] if l["type"] in ("Conv2d", "Linear", "BatchNorm2d")}


def put_model(d, tmp, mid, graph, rng, parent=None, meta=None):
    f = tmp / f"{mid}.safetensors"
    save_file(tensors_for(graph, rng), str(f))
    g = tmp / f"{mid}.graph.json"
    g.write_text(json.dumps(graph))
    args = ["put", mid, f, "--arch", g]
    if parent:
        args += ["--parent", parent]
    if meta is not None:
        args += ["--meta", json.dumps(meta)]
    d.cairn(*args)
    return f


def match(d, tmp, graph, where=None):
    g = tmp / "query.json"
    g.write_text(json.dumps(graph))
    args = ["match", g] + (["--where", json.dumps(where)] if where else [])
    return json.loads(d.cairn(*args).stdout)


def test_match_lineage_dot_and_query_errors(make_daemon, tmp):
    d = make_daemon().start()
    rng = np.random.default_rng(1)
    put_model(d, tmp, "a", conv_graph([32, 64]), rng, meta={"score": 0.5})
    put_model(d, tmp, "b", conv_graph([32, 64, 128]), rng, parent="a", meta={"score": 0.7})
    put_model(d, tmp, "c", conv_graph([32, 96]), rng, parent="a", meta={"score": 0.9})

    # A candidate extending b (renamed layers: names do not count) matches all of b but its head.
    cand = conv_graph([32, 64, 128, 256], prefix="new_")
    r = match(d, tmp, cand)
    assert r["model"] == "b"
    assert r["matched"] == 1 + 3 * 3  # stem and three blocks; fc (after block 2) differs
    assert r["layers"][0] == "new_stem" and r["score"] == 0.7
    by_layer = {t["layer"]: t for t in r["tensors"]}
    assert by_layer["new_block2"]["from"] == "block2"
    assert by_layer["new_block2"]["tensors"] == ["block2.weight"]
    assert by_layer["new_block1_relu"]["tensors"] == []  # a layer without tensors
    # Filters: only c qualifies; it shares stem and block0.
    r = match(d, tmp, cand, where={"score": {">=": 0.8}})
    assert r["model"] == "c" and r["matched"] == 4
    r = match(d, tmp, cand, where={"score": {">": 1}})
    assert r["model"] is None and r["matched"] == 0 and r["tensors"] == []

    q = json.loads(d.cairn("query", json.dumps({"op": "lca", "models": ["b", "c"]})).stdout)
    assert q["lca"] == "a"
    q = json.loads(d.cairn("query", json.dumps({"op": "path", "from": "b", "to": "c"})).stdout)
    assert q["path"] == ["b", "a", "c"]
    q = json.loads(d.cairn("query", json.dumps(
        {"op": "find", "contains_path": ["Conv2d", "BatchNorm2d", "ReLU", "Linear"], "where": {"score": {">=": 0.6}}})).stdout)
    assert q["models"] == ["c", "b"]

    dot = d.cairn("lineage", "b", "--dot").stdout
    assert dot.startswith("digraph lineage {")
    assert '"a" -> "b";' in dot and '"a" -> "c";' in dot
    assert "score 0.7" in dot
    if subprocess.run(["which", "dot"], capture_output=True).returncode == 0:
        subprocess.run(["dot", "-Tsvg"], input=dot, text=True, check=True, capture_output=True)

    # Pictures drawn by the tool itself (Graphviz's library): every model a node with its id and, on
    # a line of its own, its score; every parent an edge.
    svg = tmp / "run.svg"
    png = tmp / "run.png"
    r = d.cairn("lineage", "b", "--svg", svg, check=False)
    if r.returncode != 0 and "built without Graphviz" in r.stderr:
        pytest.skip("the cairn tool was built without Graphviz (Debian: libgraphviz-dev)")
    assert r.returncode == 0, r.stderr
    root = ET.parse(svg).getroot()
    ns = {"s": "http://www.w3.org/2000/svg"}
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    for model, score in (("a", "0.5"), ("b", "0.7"), ("c", "0.9")):
        assert model in texts and "score " + score in texts, texts
    titles = {t.text for t in root.findall(".//s:g[@class='edge']/s:title", ns)}
    assert titles == {"a->b", "a->c"}, titles
    d.cairn("lineage", "b", "--png", png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "--dot, --svg and --png are one picture each" in d.cairn("lineage", "b", "--dot", "--svg", svg,
                                                                   check=False).stderr
    missing = d.cairn("lineage", "zz", "--svg", tmp / "zz.svg", check=False)
    assert missing.returncode != 0 and "'zz'" in missing.stderr, missing.stderr
    assert not (tmp / "zz.svg").exists()

    # Precise errors, one line each, and the daemon stays up.
    def err(*args):
        r = d.cairn(*args, check=False)
        assert r.returncode != 0
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        return r.stderr
    bad = tmp / "bad.json"
    bad.write_text(json.dumps({"layers": [{"name": "x", "type": "ReLU", "inputs": ["nope"]}]}))
    assert "input 'nope' is not a layer" in err("match", bad)
    assert "unknown operator '=>'" in err("match", tmp / "query.json", "--where", '{"score": {"=>": 1}}')
    assert "not supported" in err("query", '{"op": "siblings"}')
    assert "'models' must be an array of two" in err("query", '{"op": "lca", "models": ["a"]}')
    assert "'zz' does not exist" in err("query", '{"op": "path", "from": "a", "to": "zz"}')
    assert "contains_path" in err("query", '{"op": "find", "contains_path": []}')
    assert d.alive()

    # The index is rebuilt from the repository after kill -9.
    before = match(d, tmp, cand)
    d.kill9()
    d.start()
    assert match(d, tmp, cand) == before
    assert json.loads(d.cairn("query", json.dumps({"op": "ancestors", "model": "b"})).stdout)["ancestors"] == ["a"]
    assert d.stop() == 0


def pack_blocks(d):
    total = 0
    for f in (d.repo / "packs").iterdir():
        total += f.stat().st_blocks * 512
    return total


def test_rm_gc_fsck_reclaim_exactly_what_only_retired_models_use(make_daemon, tmp):
    d = make_daemon().start()
    rng = np.random.default_rng(2)
    big = lambda: rand(rng, (1024, 256), np.float32)  # 1 MiB
    base = {"shared": big(), "only_base": big()}
    save_file(base, str(tmp / "base.safetensors"))
    child = {"shared": base["shared"], "only_child": big()}
    save_file(child, str(tmp / "child.safetensors"))
    other = {"x": big()}
    save_file(other, str(tmp / "other.safetensors"))
    d.cairn("put", "base", tmp / "base.safetensors")
    d.cairn("put", "child", tmp / "child.safetensors", "--parent", "base")
    d.cairn("put", "other", tmp / "other.safetensors")
    mib = 1 << 20
    phys0 = d.stats()["repository"]["physical_bytes"]
    assert phys0 == 4 * mib
    stored0 = d.stats()["repository"]["stored_bytes"]  # the chunks are coded: less than 4 MiB on disk
    blocks0 = pack_blocks(d)

    # Retiring changes nothing on disk; gc collects base (child still needs its lineage) and
    # releases only_base, which nothing live uses; shared stays.
    d.cairn("rm", "base")
    assert d.stats()["repository"]["physical_bytes"] == phys0
    gc = d.cairn("gc").stdout
    assert "collected 1" in gc
    assert d.stats()["repository"]["physical_bytes"] == phys0 - mib
    released = stored0 - d.stats()["repository"]["stored_bytes"]  # only_base, as stored
    assert 0 < released <= mib
    assert blocks0 - pack_blocks(d) >= released - 8192  # hole punched in base's pack (block edges aside)
    for mid, f in (("child", "child.safetensors"), ("other", "other.safetensors")):
        d.cairn("get", mid, "-o", tmp / "back.safetensors")
        assert (tmp / "back.safetensors").read_bytes() == (tmp / f).read_bytes()
    fsck = json.loads(d.cairn("fsck", "--json").stdout)
    assert fsck["ok"] and fsck["dangling"] == [] and fsck["orphaned"] == []
    assert fsck["bytes_verified"] == 3 * mib

    # Retiring the child too: both go, and with them shared and only_child.
    d.cairn("rm", "child")
    d.cairn("gc")
    assert d.stats()["repository"]["physical_bytes"] == mib
    assert json.loads(d.cairn("ls", "--all", "--json").stdout)[0]["id"] == "other"
    assert len(list((d.repo / "packs").iterdir())) == 1

    # fsck finds a flipped byte (and the read fails cleanly rather than returning it) and an
    # orphaned pack file, which gc then removes.
    pack = next((d.repo / "packs").iterdir())
    data = bytearray(pack.read_bytes())
    data[-100] ^= 0xFF
    pack.write_bytes(bytes(data))
    (d.repo / "packs" / "0000000000000000-stray.safetensors").write_bytes(b"\0" * 10000)
    r = d.cairn("fsck", check=False)
    assert r.returncode == 2
    assert "dangling: model other tensor x" in r.stdout
    assert "do not match the chunk's hash" in r.stdout or "do not decode" in r.stdout, r.stdout
    assert "no manifest references this pack file" in r.stdout
    d.stop()  # a fresh start, so the chunk is not in DRAM
    d.start()
    r = d.cairn("get", "other", "-o", tmp / "bad.safetensors", check=False)
    assert r.returncode != 0 and "CAIRN_ERR_CORRUPTION" in r.stderr or "hash" in r.stderr
    d.cairn("gc")
    assert not (d.repo / "packs" / "0000000000000000-stray.safetensors").exists()
    assert d.stop() == 0


def test_kill9_during_gc_loses_nothing_live(make_daemon, tmp):
    """A NAS-like tree of 60 models; half retired at random; gc killed with -9 at random moments,
    restarted, until one gc completes. After each kill fsck finds nothing dangling and a random
    sample of the live models reads back exact; after the final gc every live model does, and
    nothing is orphaned."""
    d = make_daemon().start()
    rng = np.random.default_rng(3)
    pyrng = random.Random(3)
    files, parents = {}, {}
    for i in range(60):
        mid = f"n{i}"
        p = f"n{pyrng.randrange(i)}" if i else None
        t = {"own": rand(rng, (256, 256), np.float32)}
        if p:
            # Inherit most of the parent: its tensors, one of them changed.
            prev = dict(np.load(tmp / f"{p}.npz"))
            t.update({k: v for k, v in prev.items() if k != "own"})
            t[f"from_{p}"] = prev["own"]
        np.savez(tmp / f"{mid}.npz", **t)
        files[mid] = tmp / f"{mid}.safetensors"
        save_file(t, str(files[mid]))
        d.cairn("put", mid, files[mid], *(["--parent", p] if p else []), "--durability", "memory")
        parents[mid] = p
    retired = set(pyrng.sample(sorted(files), 30))
    for mid in retired:
        d.cairn("rm", mid)
    live = [m for m in files if m not in retired]

    completed = False
    for attempt in range(6):
        proc = subprocess.Popen([str(CAIRN), "gc"], env=d.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(pyrng.uniform(0.0, 0.05) if attempt < 5 else 0)
        if attempt < 5:
            d.kill9()
            proc.wait(timeout=30)
            d.start()
        else:
            completed = proc.wait(timeout=120) == 0
        fsck = json.loads(d.cairn("fsck", "--json").stdout)
        assert fsck["dangling"] == [], fsck["dangling"]
        print("attempt", attempt, "models", len(json.loads(d.cairn("ls", "--all", "--json").stdout)),
              "orphaned", fsck["orphaned_bytes"], "physical", d.stats()["repository"]["physical_bytes"])
        for mid in (live if attempt == 5 else pyrng.sample(live, 6)):
            d.cairn("get", mid, "-o", tmp / "back.safetensors")
            assert (tmp / "back.safetensors").read_bytes() == files[mid].read_bytes(), mid
    assert completed
    fsck = json.loads(d.cairn("fsck", "--json").stdout)
    assert fsck["ok"] and fsck["orphaned"] == []
    listed = {m["id"] for m in json.loads(d.cairn("ls", "--all", "--json").stdout)}
    assert set(live) <= listed
    # What remains of the retired models is only what live descendants' lineage needs.
    for m in json.loads(d.cairn("ls", "--all", "--json").stdout):
        if m["id"] in retired:
            assert m.get("collected") is True
    assert d.stop() == 0


def test_hint_through_the_tool(make_daemon, tmp):
    """`cairn hint`: the daemon's answer as JSON; unknown ids listed; bad input named in one line."""
    d = make_daemon().start()
    rng = np.random.default_rng(5)
    put_model(d, tmp, "h0", conv_graph([32, 64]), rng)
    r = json.loads(d.cairn("hint", "will_load", "h0", "ghost", "--when", "next").stdout)
    assert r["kind"] == "will_load" and r["models"] == 1 and r["unknown"] == ["ghost"]
    r = json.loads(d.cairn("hint", "sequence", "h0", "--ahead", "1").stdout)
    assert r["queued"] == 1
    bad = d.cairn("hint", "soon", "h0", check=False)
    assert bad.returncode != 0 and "hint.kind" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    bad = d.cairn("hint", "will_load", "h0", "--when", "later", check=False)
    assert bad.returncode != 0 and "--when" in bad.stderr
    assert d.stats()["prefetch"]["hints"] == 2


def test_hint_population_scores_recorded_as_parent_chances(make_daemon, tmp):
    """A population hint with scores through the tool: accepted, and the trace cairnd records gives
    each member its chance to win a tournament (here 3 members, tournaments of 2: 2/3, 1/3, 0);
    bad scores are refused naming the field; without scores no chances are recorded."""
    trace = tmp / "policy.csv"
    d = make_daemon(extra_config=f"policy:\n  eviction: hints\n  trace: {trace}\n").start()
    rng = np.random.default_rng(6)
    for m in ("p0", "p1", "p2"):
        put_model(d, tmp, m, conv_graph([16, 32]), rng)
    r = json.loads(d.cairn("hint", "population", "p0", "p1", "p2", "--score", "0.5", "--score", "0.9",
                           "--score", "0.1", "--tournament", "2").stdout)
    assert r["kind"] == "population" and r["models"] == 3 and r["unknown"] == []
    bad = d.cairn("hint", "population", "p0", "p1", "--score", "0.5", "--tournament", "2", check=False)
    assert bad.returncode != 0 and "hint.scores: 1 scores for 2 models" in bad.stderr
    bad = d.cairn("hint", "population", "p0", "p1", "--score", "0.5", "--score", "0.6", check=False)
    assert bad.returncode != 0 and "hint.tournament: missing" in bad.stderr
    d.cairn("hint", "population", "p0", "p1")
    assert d.stop() == 0
    lines = [ln.split(",") for ln in trace.read_text().splitlines()[2:] if ",hint," in ln]
    pops = [i for i, f in enumerate(lines) if f[6] == "population"]
    assert len(pops) == 2
    chances = {f[2]: float(f[7]) for f in lines[pops[0] + 1:pops[1]] if f[6] == "parent_chance"}
    assert chances.keys() == {"p0", "p1", "p2"}
    assert abs(chances["p1"] - 2 / 3) < 1e-9 and abs(chances["p0"] - 1 / 3) < 1e-9 and chances["p2"] == 0
    assert not [f for f in lines[pops[1] + 1:] if f[6] == "parent_chance"]
