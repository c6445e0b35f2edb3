"""Two more parts of bench part `peers` (called by peers_bench.py, which prints and records them):

- prefetch_all: N = 2, 4, 8 members; member 0 holds a model in DRAM; `prefetch(id, all=True)` on
  member 0 puts it in every member's DRAM at once (each member fetches through the group's
  directory, so each chunk spreads as a tree and the chunks are in flight together). The time until
  all hold it, per N, against N = 2 (one transfer): the goal is a time that does not grow with N.
  Every member then reads the model with no byte moving, and exactly.
- nas: a NAS run over 4 members. In each generation every member derives a child from a parent
  that another member committed in the previous generation: it loads the parent, changes 2 of its
  8 tensors and commits the child. With peers the commits are `memory` and the parent comes from
  the committer's DRAM over the fabric; the baseline, in the same run, is the same run on 4
  daemons without peers, where a parent must be committed `global` (written and synced to the
  repository) before another daemon can read it. The figure: the handoff, from the parent's
  commit call to the child holding the parent (commit + until visible + load), per candidate.
"""
import os
import statistics
import threading
import time

import numpy as np

from peers_common import (PROVIDER, Member, arena_for, cairn, make_model, repo_files, same, stop_all, wait_verified,
                          wait_visible)

MiB = 1 << 20


def part_prefetch_all(tmp, repo, size, chunk, ns):
    rdv = tmp / "rdv"
    cap = arena_for(size)
    rows, bad = [], []
    for n in ns:
        job = f"spread{n}"
        ms = [Member(tmp / f"spread{n}-{i}", repo, 20 + i, cap, chunk, job=job, rendezvous=rdv) for i in range(n)]
        try:
            for m in ms:
                m.start()
            wait_verified(ms)
            want = make_model(size, 4, seed=300 + n)
            mid = f"spread{n}"
            with cairn.connect(ms[0].socket) as c0:
                c0.save_model(mid, want, durability="global", wait=True)
                for m in ms[1:]:
                    with cairn.connect(m.socket) as c:
                        wait_visible(c, mid)
                before = [m.movement() for m in ms]
                t0 = time.perf_counter()
                report = c0.model_prefetch(mid, all=True)
                wall = time.perf_counter() - t0
            staged = [m.movement() for m in ms]
            if not report.get("all_ok"):
                bad.append(f"prefetch --all with {n} members: not every member has it: {report.get('members')}")
            peer_b = sum(a.get("bytes_from_peer", 0) - b.get("bytes_from_peer", 0) for a, b in zip(staged, before))
            repo_b = sum(a.get("bytes_from_repository", 0) - b.get("bytes_from_repository", 0)
                         for a, b in zip(staged, before))
            if peer_b != (n - 1) * size or repo_b != 0:
                bad.append(f"prefetch --all with {n} members: {peer_b} bytes from peers (want {(n - 1) * size}), "
                           f"{repo_b} from the repository (want 0)")
            # Each member now has it: its read moves nothing and is exact.
            for m, b in zip(ms, staged):
                with cairn.connect(m.socket) as c:
                    if not same(c.load_model(mid, copy=True), want):
                        bad.append(f"prefetch --all with {n} members: {m.name} read bytes that differ")
                a = m.movement()
                moved = (a.get("bytes_from_peer", 0) - b.get("bytes_from_peer", 0) +
                         a.get("bytes_from_repository", 0) - b.get("bytes_from_repository", 0))
                if moved:
                    bad.append(f"prefetch --all with {n} members: {m.name} moved {moved} bytes on its read after")
            srv = [m.peers().get("served_bytes", 0) for m in ms]
            rows.append({"members": n, "seconds": wall, "all_seconds": report.get("all_seconds"),
                         "member_seconds": [x.get("seconds") for x in report.get("members", [])],
                         "bytes_from_peers": peer_b, "served_bytes_per_member": srv,
                         "uploaders": sum(1 for x in srv if x > 0)})
        finally:
            stop_all(ms)
    base = rows[0]["seconds"] if rows else None
    for r in rows:
        r["vs_two_members"] = r["seconds"] / base if base else None
    return {"bytes": size, "chunk_bytes": chunk, "rows": rows,
            "how": "member 0 holds the model in DRAM; prefetch(all=True) on member 0 until every member has it "
                   "(its wall time); then each member's read is checked: exact and no byte moved"}, bad


def _forget_pages(repo):
    """The repository's clean pages out of the page cache (posix_fadvise DONTNEED): on a cluster the
    node that reads a parent never had the writer's pages in its cache; on one machine it would."""
    for p in repo_files(repo):
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue  # replaced meanwhile (a compaction)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _nas_run(tmp, repo, chunk, peers, generations, tensor_bytes, tag):
    """One NAS run over 4 daemons (peers or not); returns per-candidate handoff records."""
    n = 4
    tensors = 8
    size = tensors * tensor_bytes
    rdv = tmp / "rdv"
    cap = arena_for(size * (generations + 2))
    ms = [Member(tmp / f"{tag}-{i}", repo, 30 + i, cap, chunk, job=tag if peers else None, rendezvous=rdv)
          for i in range(n)]
    durability = "memory" if peers else "global"
    records, bad = [], []
    try:
        for m in ms:
            m.start()
        if peers:
            wait_verified(ms)
        clients = [cairn.connect(m.socket) for m in ms]
        try:
            rng = np.random.default_rng(5)
            models = {}
            commit_s = {}
            # Generation 0: a random model on each member.
            for i, c in enumerate(clients):
                mid = f"{tag}-g0-{i}"
                models[mid] = make_model(size, tensors, seed=int(rng.integers(1 << 30)))
                t0 = time.perf_counter()
                c.save_model(mid, models[mid], durability=durability, wait=not peers)
                commit_s[mid] = time.perf_counter() - t0
            for g in range(1, generations + 1):
                errors = []
                out = [None] * n

                def child(i):
                    try:
                        parent = f"{tag}-g{g - 1}-{(i + 1) % n}"  # committed on the next member
                        c = clients[i]
                        t0 = time.perf_counter()
                        wait_visible(c, parent)
                        t1 = time.perf_counter()
                        _forget_pages(repo)  # (both runs; without peers the parent is read from there)
                        got = c.load_model(parent, copy=True)
                        t2 = time.perf_counter()
                        if not same(got, models[parent]):
                            bad.append(f"nas ({tag}): member {i} loaded parent {parent} with different bytes")
                        kid = dict(got)
                        seed = 1000 * g + i
                        for k in list(kid)[:2]:  # "training" changes two of the eight tensors
                            kid[k] = np.frombuffer(np.random.default_rng(seed).bytes(kid[k].nbytes), dtype=np.float32)
                            seed += 17
                        mid = f"{tag}-g{g}-{i}"
                        t3 = time.perf_counter()
                        c.save_model(mid, kid, parent=parent, durability=durability, wait=not peers)
                        t4 = time.perf_counter()
                        out[i] = (mid, kid, t4 - t3, {"generation": g, "member": i, "parent": parent,
                                                      "parent_commit_s": commit_s[parent], "visible_s": t1 - t0,
                                                      "load_s": t2 - t1})
                    except Exception as e:  # noqa: BLE001 - reported below
                        errors.append(f"member {i}: {e!r}")

                threads = [threading.Thread(target=child, args=(i,)) for i in range(n)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(600)
                if errors:
                    raise RuntimeError(f"nas ({tag}) generation {g}: " + "; ".join(errors))
                for mid, kid, cs, rec in out:
                    models[mid] = kid
                    commit_s[mid] = cs
                    rec["handoff_s"] = rec["parent_commit_s"] + rec["visible_s"] + rec["load_s"]
                    records.append(rec)
        finally:
            for c in clients:
                c.close()
        moved = [m.movement() for m in ms]
        return {"records": records, "bytes_from_peer": sum(x.get("bytes_from_peer", 0) for x in moved),
                "bytes_from_repository": sum(x.get("bytes_from_repository", 0) for x in moved),
                "model_bytes": size}, bad
    finally:
        stop_all(ms)


def part_nas(tmp, repo, chunk, generations, tensor_bytes):
    with_p, b1 = _nas_run(tmp, repo, chunk, True, generations, tensor_bytes, "nas-peers")
    without, b2 = _nas_run(tmp, repo, chunk, False, generations, tensor_bytes, "nas-alone")

    def med(run, key):
        return statistics.median(r[key] for r in run["records"])

    res = {"members": 4, "generations": generations, "tensors": 8, "model_bytes": with_p["model_bytes"],
           "provider": PROVIDER, "peers": with_p, "no_peers": without}
    for key in ("handoff_s", "load_s", "parent_commit_s", "visible_s"):
        res[f"median_{key}"] = {"peers": med(with_p, key), "no_peers": med(without, key)}
    res["how"] = ("per candidate: the parent's commit call (memory with peers, global without) + until the "
                  "child's member sees the parent + the child's load_model(copy=True) of it; medians over all "
                  "candidates; the repository's pages are dropped from the page cache (fadvise) before each "
                  "load, as a reading node on a cluster never had the writer's pages")
    return res, b1 + b2
