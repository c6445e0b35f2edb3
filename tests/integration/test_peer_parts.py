"""Multi-part models whose parts are committed on different members of a peer group ("parts on
different nodes, one manifest"; docs/peers.md, "Parts on several members"), with real daemons on
127.0.0.x sharing one repository, each with its own burst buffer:

- parts 0 and 1 committed through member a, part 2 through b, part 3 through c, at each durability:
  every part's ticket reaches it, the model appears once on every member with one manifest listing
  every tensor in part order, reads back exactly from every member; for `global` the one manifest
  is in the repository: a daemon outside the group reads it, and so does a member after a restart;
  the only bytes that move to write it are the parts the registrar (a, the holder of the most) did
  not hold; all parts through one member: no byte moves; a child whose part inherits a tensor of such
  a model; the id belongs to the job while the parts arrive (a plain commit of it is refused on every
  member);
- a part that never comes fails every part's ticket on every member naming the missing part, nothing
  is visible anywhere, and the id can be used again;
- a member killed (-9) while its part waits for the others: every surviving part's ticket fails,
  nothing is visible, and the id can be used again;
- `mpirun` of the MPI checkpoint example with its ranks on three members' daemons.
"""
import json
import os
import shutil
import subprocess
import time

import numpy as np
import pytest

from test_peers import assert_model, log_of, peers_of, wait_verified  # noqa: F401 (also pytestmark's skips)
from conftest import BUILD
from test_peers import cairn, pytestmark  # noqa: F401

CHUNK = "1MiB"


def node(make_daemon, name, repo, index, peers=True, timeout="2s"):
    """A member of job parts-1 on 127.0.0.<index>, with its own socket, arena, burst buffer and log."""
    d = make_daemon(name)
    peers_cfg = (f"peers:\n  job: parts-1\n  rendezvous: {repo.parent / 'rdv'}\n  provider: \"tcp;ofi_rxm\"\n"
                 f"  address: 127.0.0.{index}\n  timeout: {timeout}\n") if peers else "peers:\n  job: none\n"
    d.config.write_text(f"socket: {d.socket}\nrepository: {repo}\nchunk_size: {CHUNK}\nrepository_refresh: 1s\n"
                        f"tiers:\n  dram:\n    capacity: 256MiB\n"
                        f"  nvme:\n    path: {d.root / 'nvme'}\n    capacity: 256MiB\n" + peers_cfg +
                        f"log:\n  level: info\n  file: {d.root / 'cairnd.log'}\n")
    return d


def shard(rank, model_seed=0):
    """Part `rank`'s tensors: a few MiB, so that some span several chunks."""
    rng = np.random.default_rng(1000 * model_seed + rank)
    return {f"layer{rank}.weight": rng.standard_normal((768, 1024)).astype(np.float32),
            f"layer{rank}.bias": np.full(1024, rank + 100 * model_seed, np.float32),
            f"layer{rank}.scale": rng.integers(0, 255, (3, 5), dtype=np.uint8)}


def whole(ranks, model_seed=0):
    out = {}
    for r in ranks:
        out.update(shard(r, model_seed))
    return out


def part_bytes(ranks):
    """The chunk bytes of these parts (every tensor is at least one chunk)."""
    return sum(a.nbytes for r in ranks for a in shard(r).values())


def from_peers(ds):
    return sum(d.stats()["movement"].get("bytes_from_peer", 0) for d in ds)


def listed(d, mid):
    return [m for m in json.loads(d.cairn("ls", "--json").stdout) if m["id"] == mid]


def wait_idle(ds, timeout=30):
    """Until no member holds a part, collects an assembly or follows a registered model."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        parts = [peers_of(d)["parts"] for d in ds]
        if all(p["parts_held"] == 0 and p["assembling"] == 0 and p["registered"] == 0 for p in parts):
            return parts
        time.sleep(0.1)
    raise AssertionError(f"parts still held: {parts}")


def commit_parts(clients, mid, placement, durability, model_seed=0, part_timeout=10):
    """Commits part i of len(placement) through clients[placement[i]]; returns the tickets."""
    n = len(placement)
    return [clients[c].save_model(mid, shard(i, model_seed), durability=durability, part=(i, n),
                                  part_timeout=part_timeout, meta={f"rank{i}": i})
            for i, c in enumerate(placement)]


@pytest.fixture
def trio(make_daemon, tmp):
    repo = tmp / "repo"
    ds = [node(make_daemon, name, repo, i + 1).start() for i, name in enumerate("abc")]
    wait_verified(ds, 3)
    return ds


def test_parts_on_three_members_become_one_model_at_each_durability(trio, make_daemon, tmp):
    a, b, c = trio
    clients = [cairn.connect(d.socket) for d in trio]
    placement = [0, 0, 1, 2]  # parts 0, 1 through a; 2 through b; 3 through c
    levels = ["memory", "local", "global"]
    try:
        for k, durability in enumerate(levels):
            mid = f"ckpt-{durability}"
            moved = from_peers(trio)
            tickets = commit_parts(clients, mid, placement, durability, model_seed=k)
            reached = [t.wait(timeout=60) for t in tickets]
            assert all(levels.index(r) >= k for r in reached), (durability, reached)
            if durability == "global":
                # In the repository: a (the registrar) fetched parts 2 and 3 from b and c to write it.
                assert from_peers(trio) - moved == part_bytes([2, 3])
            want = whole(range(4), k)
            for d, cl in zip(trio, clients):
                assert_model(cl, mid, want)  # every tensor, in part order, exact
                assert len(listed(d, mid)) == 1, d.cairn("ls", "--json").stdout
            info = clients[1].show(mid)
            assert [t["name"] for t in info["tensors"]] == list(want)
            assert info["metadata"] == {f"rank{i}": i for i in range(4)}
        # A child of a model assembled across the members, with a part that inherits a tensor of it,
        # and a last part that waits: the parts resolve the parent where they are committed.
        t1 = clients[2].save_model("ckpt-child", shard(1, 7), parent="ckpt-local", durability="memory", part=(1, 2))
        clients[1].save_model("ckpt-child", shard(0, 7), parent="ckpt-local", inherit=["layer3.weight"],
                              durability="local", part=(0, 2), wait=True)
        t1.wait(timeout=60)
        child = dict(shard(0, 7), **{"layer3.weight": whole(range(4), 1)["layer3.weight"]}, **shard(1, 7))
        for cl in clients:
            assert_model(cl, "ckpt-child", child)
            assert cl.show("ckpt-child")["parent"] == "ckpt-local"
        # The id is the job's while its parts arrive: a plain commit of it on any member is refused.
        t0 = clients[0].save_model("ckpt-contested", shard(0, 8), durability="memory", part=(0, 2))
        for cl in clients:
            with pytest.raises(cairn.AlreadyExists):
                cl.save_model("ckpt-contested", shard(5), durability="memory", wait=True)
        clients[1].save_model("ckpt-contested", shard(1, 8), durability="memory", part=(1, 2)).wait(timeout=60)
        t0.wait(timeout=60)
        assert_model(clients[2], "ckpt-contested", whole(range(2), 8))
        # Every part through c: c registers the model and writes it; no byte moves.
        moved = from_peers(trio)
        for t in commit_parts(clients, "ckpt-one-member", [2, 2, 2], "global", model_seed=5):
            assert t.wait(timeout=60) == "global"
        assert from_peers(trio) == moved
        for cl in clients:
            assert_model(cl, "ckpt-one-member", whole(range(3), 5))
        # Every model reaches the repository (memory and local ones behind the callers); nothing held.
        for cl in clients:
            cl.flush(timeout=60)
        parts = wait_idle(trio)
        assert sum(p["assembled"] for p in parts) == 6 and sum(p["failed"] for p in parts) == 0, parts
    finally:
        for cl in clients:
            cl.close()
    # One manifest in the repository: a daemon outside the group reads each model from it alone.
    outside = node(make_daemon, "outside", tmp / "repo", 9, peers=False).start()
    with cairn.connect(outside.socket) as co:
        for k, durability in enumerate(levels):
            assert_model(co, f"ckpt-{durability}", whole(range(4), k))
    assert outside.stats()["movement"].get("bytes_from_peer", 0) == 0
    outside.stop()
    # A member restarted reads the global one back from the repository.
    b.stop()
    b.start()
    with cairn.connect(b.socket) as cb:
        assert_model(cb, "ckpt-global", whole(range(4), 2))


def test_a_missing_part_fails_every_ticket_on_every_member(trio):
    clients = [cairn.connect(d.socket) for d in trio]
    try:
        t0 = time.monotonic()
        # Part 2 of 4 is never committed.
        tickets = [clients[c].save_model("gap", shard(i), durability="memory", part=(i, 4), part_timeout=1.5)
                   for i, c in ((0, 0), (1, 1), (3, 2))]
        for t in tickets:
            with pytest.raises(cairn.CairnError) as e:
                t.wait(timeout=60)
            assert "part 2 of 4 did not arrive" in str(e.value), str(e.value)
        assert time.monotonic() - t0 < 20
        for d, cl in zip(trio, clients):
            with pytest.raises(cairn.NotFound):
                cl.load_model("gap")
            assert not listed(d, "gap")
        wait_idle(trio)
        # The id is free again, for a multi-part model across the members as for any model.
        for t in commit_parts(clients, "gap", [2, 1, 0], "memory"):
            t.wait(timeout=60)
        for cl in clients:
            assert_model(cl, "gap", whole(range(3)))
    finally:
        for cl in clients:
            cl.close()


def test_a_member_killed_mid_assembly_fails_every_part(trio):
    a, b, c = trio
    clients = [cairn.connect(d.socket) for d in trio]
    try:
        # Parts 0 (through a) and 1 (through b) are in; b dies before part 2 comes through c.
        t_a = clients[0].save_model("orphan", shard(0), durability="memory", part=(0, 3), part_timeout=4)
        clients[1].save_model("orphan", shard(1), durability="memory", part=(1, 3), part_timeout=4)
        time.sleep(0.3)
        b.kill9()
        t_c = clients[2].save_model("orphan", shard(2), durability="memory", part=(2, 3), part_timeout=4)
        errors = []
        for t in (t_a, t_c):
            with pytest.raises(cairn.CairnError) as e:
                t.wait(timeout=60)
            errors.append(str(e.value))
        for err in errors:
            assert "'orphan' was not created" in err, errors
        for d, cl in ((a, clients[0]), (c, clients[2])):
            with pytest.raises(cairn.NotFound):
                cl.load_model("orphan")
            assert not listed(d, "orphan")
        wait_idle([a, c])
        # The survivors make it again (the dead member's claim on the id is void).
        t0 = clients[0].save_model("orphan", shard(0), durability="global", part=(0, 2))
        t1 = clients[2].save_model("orphan", shard(1), durability="global", part=(1, 2))
        for t in (t0, t1):
            t.wait(timeout=60)
        for cl in (clients[0], clients[2]):
            assert_model(cl, "orphan", whole(range(2)))
    finally:
        for cl in (clients[0], clients[2]):
            cl.close()


def test_mpi_checkpoint_with_ranks_on_three_members(trio):
    """workflow/examples/mpi_checkpoint with ranks 0-1 on a's daemon, 2 on b's, 3 on c's (as ranks on
    three nodes would be): one model, restored exactly by every rank, seen by every member."""
    example = BUILD / "bin" / "mpi_checkpoint"
    if not example.exists() or shutil.which("mpirun") is None:
        pytest.skip("needs mpirun and the MPI example (built with MPI)")
    a, b, c = trio
    # Each rank's daemon, and its "node" for the restore (each node reads its share from its daemon).
    wrapper = ('case $OMPI_COMM_WORLD_RANK in 0|1) n=0; s="%s";; 2) n=1; s="%s";; *) n=2; s="%s";; esac; '
               'CAIRN_SOCKET="$s" CAIRN_MPI_NODE=$n exec "$0" "$@"') % (a.socket, b.socket, c.socket)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    p = subprocess.run(["mpirun", "-np", "4", "sh", "-c", wrapper, str(example), "--id", "mpi-spread", "--mib", "16",
                        "--durability", "global"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True, timeout=300)
    assert p.returncode == 0, p.stdout
    assert "4 ranks" in p.stdout and "restore exact on every rank" in p.stdout, p.stdout
    for d in trio:
        show = json.loads(d.cairn("show", "mpi-spread").stdout)
        assert len(show["tensors"]) == 12, show
