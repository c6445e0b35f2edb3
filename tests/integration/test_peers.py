"""The daemons of one job as a cooperative cache over libfabric, checked as a new user would:

- 4 daemons with peers on one machine (each its own socket, arena and 127.0.0.x address, one
  repository): a model put through one is read back exactly through every other, and the
  repository is read for it at most once in total (the stats of all members summed); `cairn peers
  --json` on each lists the 4 members, verified;
- a model only the repository holds, read by 3 members at once: each chunk is read from the
  repository once for the job, the rest comes from peers;
- kill -9 of the member that holds the only DRAM copy while others read: every reader gets exact
  bytes within the timeout, the survivors keep serving;
- a daemon of another job, or of this job without the secret, is refused (its messages fail the
  group's MAC) and is served nothing; a member that sends corrupted chunks never makes a reader
  see them;
- the same id committed on two members at once: exactly one succeeds;
- a model committed `memory` on one member is listed, matched (`cairn match`) and read exactly on
  another through the job's catalog, not the repository (that member never refreshes its view);
- `cairn prefetch ID --all` puts a model in every member's DRAM at once: each member's later read
  moves no byte, and the repository is read at most once for the job;
- after kill -9 and restart of a member, gc run by every member at once (each waits for the one
  before, then takes its grace) holds no read through the others: each takes well under 3x the
  peers timeout.
"""
import json
import os
import re
import shutil
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import CAIRN, CAIRND, LIBCAIRN, SOURCE  # noqa: F401
from stfiles import rand

sys.path.insert(0, str(SOURCE / "api" / "python"))
os.environ.setdefault("CAIRN_LIBRARY", str(LIBCAIRN))
import cairn  # noqa: E402

# A system suite (several daemons talking over libfabric): it runs once, in the normal build.
pytestmark = [
    pytest.mark.skipif(os.environ.get("CAIRN_SANITIZED") == "1", reason="multi-daemon suite: normal build only"),
    pytest.mark.skipif(shutil.which("fi_info") is None and not Path("/usr/lib/x86_64-linux-gnu/libfabric.so.1").exists(),
                       reason="libfabric is not installed (scripts/deps installs it)"),
]

CHUNK = "4MiB"


def member(make_daemon, name, repo, index, job="job-1", rendezvous=None, dram="512MiB", timeout="3s", extra_env=None,
           peers=True, refresh="1s"):
    """A daemon of the job on 127.0.0.<index>, with its own socket, arena and log, on repository `repo`."""
    d = make_daemon(name)
    d.repo = Path(repo)
    rdv = rendezvous or (Path(repo).parent / "rdv")
    peers_cfg = (f"peers:\n  job: \"{job}\"\n  rendezvous: {rdv}\n  provider: \"tcp;ofi_rxm\"\n"
                 f"  address: 127.0.0.{index}\n  timeout: {timeout}\n") if peers else "peers:\n  job: none\n"
    d.config.write_text(f"socket: {d.socket}\nrepository: {repo}\nchunk_size: {CHUNK}\nrepository_refresh: {refresh}\n"
                        f"tiers:\n  dram:\n    capacity: {dram}\n" + peers_cfg +
                        f"log:\n  level: info\n  file: {d.root / 'cairnd.log'}\n")
    if extra_env:
        d.env.update(extra_env)
    return d


def peers_of(d):
    return json.loads(d.cairn("peers", "--json").stdout)


def wait_verified(daemons, n, timeout=20):
    """Until every daemon has verified n-1 others."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        views = [peers_of(d) for d in daemons]
        if all(sum(m["state"] == "verified" for m in v["members"]) == n - 1 for v in views):
            return views
        time.sleep(0.2)
    raise AssertionError("members did not verify each other: " + json.dumps([peers_of(d) for d in daemons])[:3000])


def movement(d):
    return d.stats()["movement"]


def model(rng, mib):
    """A model of `mib` MiB in 4 tensors."""
    n = mib * (1 << 20) // 4 // 4
    return {f"layer{i}.weight": rand(rng, (n,), np.float32) for i in range(4)}


def assert_model(client, mid, want):
    got = client.load_model(mid, copy=True)
    assert list(got) == list(want), (mid, list(got))
    for k, v in want.items():
        assert np.array_equal(got[k], v), f"model {mid!r} tensor {k!r} differs"


def log_of(d):
    p = d.root / "cairnd.log"
    return p.read_text(errors="replace") if p.exists() else ""


def test_four_members_read_through_each_other(make_daemon, tmp):
    repo = tmp / "repo"
    ds = [member(make_daemon, f"m{i}", repo, i + 1).start() for i in range(4)]
    views = wait_verified(ds, 4)
    for v in views:
        assert len(v["members"]) == 4 and v["job"] == "job-1"
    rng = np.random.default_rng(7)
    want = model(rng, 256)
    with cairn.connect(ds[0].socket) as c0:
        c0.save_model("base", want, durability="global", wait=True)
    before = sum(movement(d)["bytes_from_repository"] for d in ds)
    for d in ds[1:]:
        with cairn.connect(d.socket) as c:
            assert_model(c, "base", want)
    read_from_repo = sum(movement(d)["bytes_from_repository"] for d in ds) - before
    from_peers = sum(movement(d)["bytes_from_peer"] for d in ds)
    assert read_from_repo <= 256 << 20, f"the repository was read {read_from_repo} bytes for a 256 MiB model"
    assert from_peers >= 2 * (256 << 20), f"only {from_peers} bytes came from peers"
    # `cairn peers` (text) names the members and the bytes.
    out = ds[1].cairn("peers").stdout
    assert "4 members" in out and "verified" in out


def test_cold_model_is_read_from_the_repository_once_per_job(make_daemon, tmp):
    repo = tmp / "repo"
    # The model reaches the repository through a daemon outside the group.
    writer = member(make_daemon, "writer", repo, 9, peers=False).start()
    rng = np.random.default_rng(8)
    want = model(rng, 64)
    with cairn.connect(writer.socket) as cw:
        cw.save_model("cold", want, durability="global", wait=True)
    writer.stop()
    ds = [member(make_daemon, f"r{i}", repo, i + 1).start() for i in range(3)]
    wait_verified(ds, 3)
    errors = []

    def read(d):
        try:
            with cairn.connect(d.socket) as c:
                assert_model(c, "cold", want)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=read, args=(d,)) for d in ds]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    repo_bytes = sum(movement(d)["bytes_from_repository"] for d in ds)
    peer_bytes = sum(movement(d)["bytes_from_peer"] for d in ds)
    assert repo_bytes == 64 << 20, f"the job read {repo_bytes} bytes from the repository for a 64 MiB model"
    assert peer_bytes == 2 * (64 << 20), f"{peer_bytes} bytes from peers"


def test_kill9_of_the_holder_while_others_read(make_daemon, tmp):
    repo = tmp / "repo"
    ds = [member(make_daemon, f"k{i}", repo, i + 1, timeout="2s").start() for i in range(4)]
    wait_verified(ds, 4)
    rng = np.random.default_rng(9)
    want = model(rng, 64)
    with cairn.connect(ds[0].socket) as c0:
        c0.save_model("hot", want, durability="global", wait=True)
    errors, done = [], []

    def read(d):
        try:
            with cairn.connect(d.socket) as c:
                t0 = time.time()
                assert_model(c, "hot", want)
                done.append(time.time() - t0)
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=read, args=(d,)) for d in ds[1:]]
    for t in threads:
        t.start()
    time.sleep(0.05)
    ds[0].kill9()
    for t in threads:
        t.join(60)
    crashed = [(d.root.name, d.proc.stderr.read().decode(errors="replace")[-3000:]) for d in ds[1:] if not d.alive()]
    for name, err in crashed:
        (tmp.parent / f"crash-{name}.txt").write_text(err)
    assert not crashed, crashed
    assert not errors, errors
    assert len(done) == 3
    # Within the timeout (2 s) per failed chunk wait and some: nothing hangs.
    assert max(done) < 30, done
    # The survivors keep serving: a new model through one, read through the others.
    want2 = model(rng, 16)
    with cairn.connect(ds[1].socket) as c1:
        c1.save_model("after", want2, durability="memory", wait=True)
        c1.flush(timeout=60)
    for d in ds[2:]:
        with cairn.connect(d.socket) as c:
            assert_model(c, "after", want2)
    deadline = time.time() + 10
    while time.time() < deadline and len(peers_of(ds[1])["members"]) != 3:
        time.sleep(0.2)
    assert len(peers_of(ds[1])["members"]) == 3, "the killed member is still listed"


def test_another_job_and_a_daemon_without_the_secret_are_refused(make_daemon, tmp):
    repo = tmp / "repo"
    a = member(make_daemon, "a", repo, 1).start()
    b = member(make_daemon, "b", repo, 2).start()
    wait_verified([a, b], 2)
    # Another job on the same rendezvous directory: a group of its own, sees nobody.
    other = member(make_daemon, "other", repo, 3, job="job-2").start()
    assert [m["id"] for m in peers_of(other)["members"]] == [peers_of(other)["self"]]
    assert len(peers_of(a)["members"]) == 2
    # The right job id, the members' addresses copied, but its own secret: its hellos fail the MAC.
    fake_rdv = tmp / "fake-rdv"
    (fake_rdv / "job-1" / "members").mkdir(parents=True)
    for f in (tmp / "rdv" / "job-1" / "members").glob("*.json"):
        shutil.copy(f, fake_rdv / "job-1" / "members" / f.name)
    intruder = member(make_daemon, "intruder", repo, 4, rendezvous=fake_rdv).start()
    time.sleep(3)
    view = peers_of(intruder)
    assert all(m["state"] != "verified" for m in view["members"] if not m["self"]), view
    refused = peers_of(a)["refused_frames"] + peers_of(b)["refused_frames"]
    assert refused > 0, "the members did not notice the intruder's messages"
    assert "refused a message that is not from a member" in log_of(a) + log_of(b)
    # The intruder is served nothing: a model in a's memory only is not readable through it.
    rng = np.random.default_rng(10)
    want = model(rng, 8)
    with cairn.connect(a.socket) as ca:
        ca.save_model("secret-model", want, durability="global", wait=True)
    assert peers_of(intruder)["fetched_chunks"] == 0
    with cairn.connect(intruder.socket) as ci:
        assert_model(ci, "secret-model", want)  # from the repository, which it may read
    assert movement(intruder)["bytes_from_peer"] == 0


def test_corrupted_chunks_from_a_peer_are_never_seen(make_daemon, tmp):
    repo = tmp / "repo"
    bad = member(make_daemon, "bad", repo, 1, extra_env={"CAIRN_PEERS_FAULT": "corrupt_bodies"}).start()
    good = member(make_daemon, "good", repo, 2).start()
    wait_verified([bad, good], 2)
    rng = np.random.default_rng(11)
    want = model(rng, 32)
    with cairn.connect(bad.socket) as cb:
        cb.save_model("m", want, durability="global", wait=True)
    with cairn.connect(good.socket) as cg:
        assert_model(cg, "m", want)
    st = peers_of(good)
    assert st["bad_bodies"] > 0, st
    assert movement(good)["bytes_from_repository"] == 32 << 20
    assert "fails its hash" in log_of(good) or "wrong bytes" in log_of(good)


def dram_held(d):
    """Arena bytes held beyond the chunks themselves (pins and spans no chunk owns)."""
    t = d.stats()["tiers"]["dram"]
    return t["pinned_bytes"] + t["used_bytes"] - t["chunk_bytes"]


def wait_for(what, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if what():
            return True
        time.sleep(0.1)
    return what()


@pytest.mark.parametrize("reader_drains", [True, False])
def test_a_body_sent_after_its_reader_gave_up_holds_no_arena_space(make_daemon, tmp, reader_drains):
    """Over tcp;ofi_rxm a chunk body is a rendezvous send that completes only when the receiver takes
    it. A reader that timed out (or died) never does, and a holder that waited for it would keep the
    chunk pinned for good ("arena space still held with every client gone"). So the reader leaves a
    receive that takes a late body and drops it (late_bodies_drained), and a holder gives a pin up 3
    peer timeouts after the send started in any case (abandoned_sends)."""
    repo = tmp / "repo"
    holder = member(make_daemon, "late", repo, 1, timeout="1s", extra_env={"CAIRN_PEERS_FAULT": "late_bodies"}).start()
    reader = member(make_daemon, "rd", repo, 2, timeout="1s",
                    extra_env=None if reader_drains else {"CAIRN_PEERS_FAULT": "no_drain"}).start()
    wait_verified([holder, reader], 2)
    rng = np.random.default_rng(13)
    want = model(rng, 8)  # 4 tensors of 2 MiB: bodies far past rxm's eager size
    with cairn.connect(holder.socket) as ch:
        ch.save_model("late", want, durability="global", wait=True)
    assert dram_held(holder) == 0
    # Its 4 chunks (one per tensor) are announced to their homes, so the reader asks the holder.
    assert wait_for(lambda: sum(peers_of(d)["directory_entries"] for d in (holder, reader)) >= 4, 10)
    t0 = time.time()
    with cairn.connect(reader.socket) as cr:
        assert_model(cr, "late", want)  # each chunk: the holder's body is late, the repository serves it
    assert peers_of(reader)["timeouts"] >= 1, peers_of(reader)
    assert movement(reader)["bytes_from_peer"] == 0
    # The late bodies go out 1.5 timeouts after their gets; every pin is gone within the bound.
    assert wait_for(lambda: dram_held(holder) == 0, 3 * 1 + 10), (holder.stats()["tiers"]["dram"], peers_of(holder))
    assert peers_of(holder)["sends_in_flight"] == 0, peers_of(holder)
    hs, rs = peers_of(holder), peers_of(reader)
    if reader_drains:
        assert wait_for(lambda: peers_of(reader)["late_bodies_drained"] >= 1, 5), peers_of(reader)
        assert hs["abandoned_sends"] == 0, hs  # the sends completed: the reader took the bodies
    else:
        assert rs["late_bodies_drained"] == 0, rs
        assert hs["abandoned_sends"] >= 1, hs  # the holder gave the pins up itself
        assert "its arena space is no longer held for it" in log_of(holder)
    assert time.time() - t0 < 60
    # Both keep serving: a model through the reader, read back through the holder.
    want2 = model(rng, 4)
    with cairn.connect(reader.socket) as cr:
        cr.save_model("after", want2, durability="global", wait=True)
    with cairn.connect(holder.socket) as ch:
        assert_model(ch, "after", want2)
    assert wait_for(lambda: dram_held(holder) == 0 and dram_held(reader) == 0, 10)


def test_same_id_on_two_members_at_once(make_daemon, tmp):
    repo = tmp / "repo"
    a = member(make_daemon, "a", repo, 1).start()
    b = member(make_daemon, "b", repo, 2).start()
    wait_verified([a, b], 2)
    for round_ in range(5):
        results = []
        mid = f"contested-{round_}"

        def commit(d, seed, mid=mid, results=results):
            want = model(np.random.default_rng(seed), 4)
            try:
                with cairn.connect(d.socket) as c:
                    c.save_model(mid, want, durability="memory", wait=True)
                results.append("ok")
            except cairn.AlreadyExists:
                results.append("exists")

        threads = [threading.Thread(target=commit, args=(d, 100 * round_ + i)) for i, d in enumerate((a, b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(results) == ["exists", "ok"], (mid, results)


def chain_graph(widths):
    """stem -> Linear layers; one tensor per layer named '<layer>.weight'."""
    layers = [{"name": "stem", "type": "Linear", "config": {"out_features": widths[0]}, "inputs": []}]
    for i, w in enumerate(widths[1:]):
        layers.append({"name": f"l{i}", "type": "Linear", "config": {"out_features": w}, "inputs": [layers[-1]["name"]]})
    return {"layers": layers}


def test_a_model_committed_on_one_member_is_seen_by_the_others_at_once(make_daemon, tmp):
    repo = tmp / "repo"
    a = member(make_daemon, "a", repo, 1).start()
    # b never refreshes its view of the repository: what it sees of a's models comes from the group.
    b = member(make_daemon, "b", repo, 2, refresh="0").start()
    wait_verified([a, b], 2)
    rng = np.random.default_rng(13)
    graph = chain_graph([64, 128, 256])
    want = {l["name"] + ".weight": rand(rng, (256, 256), np.float32) for l in graph["layers"]}
    with cairn.connect(a.socket) as ca:
        ca.save_model("parent", want, arch=graph, meta={"score": 0.5}, durability="memory", wait=True)
        child = dict(want, **{"l1.weight": rand(rng, (256, 256), np.float32)})
        ca.save_model("child", child, parent="parent", arch=graph, meta={"score": 0.8}, durability="memory", wait=True)
    deadline = time.time() + 10
    listed = {}
    while time.time() < deadline:
        listed = {m["id"]: m for m in json.loads(b.cairn("ls", "--json").stdout)}
        if "parent" in listed and "child" in listed:
            break
        time.sleep(0.05)
    assert "parent" in listed and "child" in listed, listed
    assert listed["child"].get("peer") is True
    # Lineage and best_ancestor answer over the job: a candidate extending the graph matches child
    # (the higher score) on b.
    q = tmp / "query.json"
    q.write_text(json.dumps(chain_graph([64, 128, 256, 512])))
    r = json.loads(b.cairn("match", q).stdout)
    assert r["model"] == "child", r
    with cairn.connect(b.socket) as cb:
        assert_model(cb, "child", child)
        assert_model(cb, "parent", want)
        assert cb.show("child")["parent"] == "parent"
    assert peers_of(b)["models_received"] >= 2
    assert peers_of(a)["models_announced"] >= 2


def test_prefetch_all_spreads_a_model_to_every_member(make_daemon, tmp):
    repo = tmp / "repo"
    ds = [member(make_daemon, f"p{i}", repo, i + 1).start() for i in range(4)]
    wait_verified(ds, 4)
    rng = np.random.default_rng(11)
    want = model(rng, 96)
    nbytes = sum(v.nbytes for v in want.values())
    with cairn.connect(ds[0].socket) as c0:
        c0.save_model("spread", want, durability="memory")
    # Every member knows the model (the job's catalog) before it is asked to stage it.
    for d in ds[1:]:
        deadline = time.time() + 20
        while d.cairn("show", "spread", check=False).returncode != 0:
            assert time.time() < deadline, "the model did not reach the job's catalog"
            time.sleep(0.1)
    before = [movement(d) for d in ds]
    out = json.loads(ds[0].cairn("prefetch", "spread", "--all", "--json").stdout)
    assert out["all_ok"] and out["peers"], out
    assert sorted(m["member"] for m in out["members"]) == sorted(
        m["id"] for m in peers_of(ds[0])["members"] if not m.get("self")), out
    for m in out["members"]:
        assert m["ok"] and m["bytes"] == nbytes, m
    staged = [movement(d) for d in ds]
    repo_read = sum(a["bytes_from_repository"] - b["bytes_from_repository"] for a, b in zip(staged, before))
    assert repo_read == 0, f"the repository was read {repo_read} bytes (the model was in member 0's DRAM)"
    assert sum(a["bytes_from_peer"] - b["bytes_from_peer"] for a, b in zip(staged, before)) == 3 * nbytes
    # Each member now reads it from its own DRAM: no byte moves.
    for d, b in zip(ds, staged):
        with cairn.connect(d.socket) as c:
            assert_model(c, "spread", want)
        a = movement(d)
        assert a["bytes_from_peer"] == b["bytes_from_peer"] and a["bytes_from_repository"] == b["bytes_from_repository"]
    # The C API / Python face of it (cairn_model_prefetch with all), from another member.
    with cairn.connect(ds[2].socket) as c:
        r = c.model_prefetch("spread", all=True)
        assert r["all_ok"] and len(r["members"]) == 3 and all(m["bytes"] == nbytes for m in r["members"]), r
        assert c.model_prefetch("spread")["bytes"] == nbytes
    # The human form, and an unknown model (nobody is asked).
    text = ds[1].cairn("prefetch", "spread", "--all").stdout
    assert "on 3 other members" in text and text.count(" ok ") == 3, text
    r = ds[1].cairn("prefetch", "nosuch", "--all", check=False)
    assert r.returncode != 0 and "nosuch" in r.stderr
    # With --progress on a pipe: plain lines, the members' answers counted out of the 3 asked, a summary.
    r = ds[1].cairn("prefetch", "spread", "--all", "--progress")
    lines = r.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("prefetch spread: ") and "\r" not in r.stderr, r.stderr
    for line in lines:
        if "other members prefetched: " in line:
            assert re.search(r"other members prefetched: [0-3] / 3 ", line), line


def test_reads_go_on_while_the_group_runs_gc_after_a_kill9(make_daemon, tmp):
    """The torture harness's slow reads: after kill -9 and restart of a member, reads through the
    others (of models committed on the reading member itself, in its DRAM) took 5, 10 ... 30 s. gc
    held the daemon's gc lock, which every read and commit takes, while it waited for another
    member's gc (the repository's maintenance lease) and through its own grace (gc_grace, 5 s,
    while other writers are alive: always, in a group). A read must not wait for gc's waits."""
    repo = tmp / "repo"
    timeout_s = 2
    ds = [member(make_daemon, f"g{i}", repo, i + 1, timeout=f"{timeout_s}s").start() for i in range(3)]
    wait_verified(ds, 3)
    rng = np.random.default_rng(13)
    wants = {}
    for i, d in enumerate(ds):  # every member a writer of the repository
        with cairn.connect(d.socket) as c:
            for level in ("global", "memory"):
                w = model(rng, 8)
                c.save_model(f"{level}{i}", w, durability=level, wait=True)
                wants[f"{level}{i}"] = w
            c.save_model(f"old{i}", model(rng, 4), durability="global", wait=True)
            c.remove(f"old{i}")  # something for gc to collect
    ds[1].kill9()  # its `memory` model goes with it
    del wants["memory1"]
    ds[1].start()  # same address, a new member id
    wait_verified(ds, 3)
    for d in (ds[0], ds[2]):  # through the others: each member's models, exact
        with cairn.connect(d.socket) as c:
            for mid, w in wants.items():
                assert_model(c, mid, w)

    gcs, gc_errors = [], []

    def gc(d):
        try:
            with cairn.connect(d.socket) as c:
                t0 = time.time()
                c.gc()
                gcs.append(time.time() - t0)
        except Exception as e:  # noqa: BLE001
            gc_errors.append(repr(e))

    threads = []
    for d in (ds[2], ds[1], ds[0]):  # one after another: each waits for the one before (the lease)
        threads.append(threading.Thread(target=gc, args=(d,)))
        threads[-1].start()
        time.sleep(0.3)
    slowest = {}
    while any(t.is_alive() for t in threads):
        for k, d in ((0, ds[0]), (2, ds[2])):
            with cairn.connect(d.socket) as c:
                for mid in (f"memory{k}", "global1"):
                    t0 = time.time()
                    assert_model(c, mid, wants[mid])
                    key = f"{mid} through member {k}"
                    slowest[key] = max(slowest.get(key, 0), time.time() - t0)
    for t in threads:
        t.join(120)
    assert not gc_errors, gc_errors
    assert len(gcs) == 3
    # gc still takes its grace (5 s each, one after another): the reads went on meanwhile.
    assert max(gcs) >= 5, gcs
    assert slowest and max(slowest.values()) < 3 * timeout_s, (slowest, gcs)
    for i, d in enumerate(ds):
        with cairn.connect(d.socket) as c:
            with pytest.raises(cairn.NotFound):
                c.load_model(f"old{i}", copy=True)
