"""The faults a torture run injects. Each takes the run (torture.Run) and returns a short description
for the timeline; the run's oracle checks after each one.

- kill9_daemon: kill -9 of a daemon at a random moment of its load, restarted after 0-0.5 s;
- kill9_daemon_in_gc: the same while it runs a gc;
- kill9_client: kill -9 of a worker process (it holds leases, views, open writes), replaced;
- kill9_gc: kill -9 of a `cairn gc` client mid-request;
- sigstop_peer: SIGSTOP of a group member for longer than the peer timeout while the others serve;
- corrupt_pack / corrupt_bb: one flipped bit, or 4 KiB zeroed (a torn write), in a repository pack or
  the burst buffer's data file under a running daemon; every model is read while it is there (exact
  or an error: never wrong bytes), then the bytes are put back;
- io_fault: ENOSPC or EIO (or a torn/dropped write) injected through the daemon's filesystem seam
  (`cairn fault add`, needs debug.fault_injection), for a while, then cleared;
- arena_full: a client fills the DRAM arena (leases on every model it can map, named tensors until
  CAIRN_ERR_NO_SPACE), holds it, then is killed or exits.
"""
import json
import os
import random
import subprocess
import time
from pathlib import Path

from cluster import CAIRN


def kill9_daemon(run, node=None, during_gc=False):
    n = node if node is not None else run.rng.choice(run.live_nodes())
    if during_gc:
        gc = subprocess.Popen([str(CAIRN), "gc"], env=n.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(run.rng.random() * 0.3)
    else:
        time.sleep(run.rng.random() * 0.2)
    run.oracle.killed(n.index, time.monotonic())
    n.kill9()
    run.kill_points += 1
    if during_gc:
        gc.wait()
    time.sleep(run.rng.random() * 0.5)
    n.start()
    return f"kill -9 of daemon {n.index}{' during a gc' if during_gc else ''}, restarted"


def kill9_daemon_in_gc(run):
    return kill9_daemon(run, during_gc=True)


def kill9_client(run):
    w = run.rng.choice(run.workers)
    w.proc.kill()
    w.proc.wait()
    run.kill_points += 1
    run.replace_worker(w)
    return f"kill -9 of client {w.name} (node {w.node})"


def kill9_gc(run):
    n = run.rng.choice(run.live_nodes())
    gc = subprocess.Popen([str(CAIRN), "gc"], env=n.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(run.rng.random() * 0.2)
    gc.kill()
    gc.wait()
    run.kill_points += 1
    return f"kill -9 of `cairn gc` on daemon {n.index}"


def sigstop_peer(run):
    if len(run.nodes) < 2:
        return kill9_daemon(run)
    n = run.rng.choice(run.live_nodes())
    n.stop()
    try:
        time.sleep(run.peer_timeout + 0.5)
        # The others keep serving exact data meanwhile: every global model, through each of them.
        for other in run.live_nodes():
            if other is not n:
                run.check_node(other, limit=8, only_global=True)
    finally:
        n.cont()
    return f"SIGSTOP of daemon {n.index} for {run.peer_timeout + 0.5:.1f} s, then SIGCONT"


def _data_offset(path: Path, rng: random.Random):
    """A random offset inside the written parts of a (sparse) file, or None."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        regions, pos = [], 0
        while pos < size:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
                end = os.lseek(fd, start, os.SEEK_HOLE)
            except OSError:
                break
            regions.append((start, end))
            pos = end
        regions = [(a, b) for a, b in regions if b - a >= 8192]
        if not regions:
            return None
        a, b = rng.choice(regions)
        return rng.randrange(a, b - 4096) & ~7
    finally:
        os.close(fd)


def _corrupt(run, files, what):
    files = [f for f in files if f.is_file() and f.stat().st_size > 8192]
    if not files:
        return f"{what}: no file to corrupt yet"
    path = run.rng.choice(files)
    off = _data_offset(path, run.rng)
    if off is None:
        return f"{what}: nothing written in {path.name} yet"
    torn = run.rng.random() < 0.3
    length = 4096 if torn else 1
    # A gc may delete the pack at any moment (a pack nobody references any more): then there is
    # nothing to damage, or nothing to restore.
    try:
        with open(path, "r+b") as f:
            f.seek(off)
            saved = f.read(length)
            if len(saved) < length:
                return f"{what}: {path.name} is shorter than {off + length} bytes now"
            f.seek(off)
            f.write(bytes(length) if torn else bytes([saved[0] ^ (1 << run.rng.randrange(8))]))
            f.flush()
            os.fsync(f.fileno())
    except FileNotFoundError:
        return f"{what}: {path.name} was deleted by a gc before it could be damaged"
    try:
        # Models through every daemon while the damage is there: exact bytes or an error.
        for n in run.live_nodes():
            run.check_node(n, limit=48, damaged=True)
    finally:
        try:
            with open(path, "r+b") as f:  # the damage is undone: later checks must find everything exact
                f.seek(off)
                f.write(saved)
                f.flush()
                os.fsync(f.fileno())
        except FileNotFoundError:
            pass  # deleted by a gc meanwhile: nobody references it
    return f"{what}: {'4 KiB zeroed' if torn else 'one bit flipped'} in {path.relative_to(run.root)} at {off}, " \
           f"every model read, then restored"


def corrupt_pack(run):
    return _corrupt(run, list((run.repo / "packs").glob("*")), "repository pack")


def corrupt_bb(run):
    return _corrupt(run, [n.root / "nvme" / "data" for n in run.live_nodes()], "burst buffer")


IO_RULES = [
    ["--op", "write", "--path", "/packs/", "--error", "ENOSPC"],
    ["--op", "write", "--path", "/logs/", "--error", "EIO"],
    ["--op", "sync", "--path", "/packs/", "--error", "EIO"],
    ["--op", "read", "--path", "/packs/", "--error", "EIO"],
    ["--op", "write", "--path", "/nvme/", "--error", "ENOSPC"],
    ["--op", "read", "--path", "/nvme/", "--error", "EIO"],
    ["--op", "write", "--path", "/packs/", "--effect", "short_write"],
    ["--op", "write", "--path", "/nvme/", "--effect", "short_write"],
    ["--op", "read", "--path", "/packs/", "--effect", "flip_bit"],
    ["--op", "read", "--path", "/nvme/", "--effect", "flip_bit"],
    # Not injected: drop_write and flip_bit on writes, a device that acknowledges bytes it did not
    # store. cairn detects them when the bytes are read (every chunk is hashed), never serves them,
    # but a model whose only copy was lost that way is lost (docs/reliability.md).
    ["--op", "write", "--path", "/logs/", "--effect", "short_write"],
    ["--op", "read", "--path", "/packs/", "--effect", "delay", "--delay-ms", "1500"],
]


def io_fault(run):
    if not run.faults_enabled:
        return corrupt_pack(run)
    n = run.rng.choice(run.live_nodes())
    rule = run.rng.choice(IO_RULES) + ["--times", str(run.rng.randint(1, 20))]
    r = n.cairn("fault", "add", *rule)
    if r.returncode != 0:
        run.oracle.violation(f"`cairn fault add {' '.join(rule)}` failed: {r.stderr.strip()[:300]}")
        return "io fault: could not be added"
    time.sleep(0.3 + run.rng.random())
    listed = n.cairn("fault", "list", "--json")
    n.cairn("fault", "clear")
    injected = ""
    try:
        rules = json.loads(listed.stdout)
        rules = rules.get("rules", []) if isinstance(rules, dict) else rules
        injected = f", {sum(x.get('injected', 0) for x in rules)} injected"
    except (ValueError, AttributeError, TypeError):
        pass
    return f"io fault on daemon {n.index}: {' '.join(rule)}{injected}, then cleared"


def arena_full(run):
    n = run.rng.choice(run.live_nodes())
    w = run.start_worker(n.index, hog=True)
    time.sleep(1.0 + run.rng.random() * 2)
    if run.rng.random() < 0.5:
        w.proc.kill()
        run.kill_points += 1
        how = "killed -9"
    else:
        w.proc.terminate()
        how = "ended"
    w.proc.wait()
    run.workers.remove(w)
    return f"arena of daemon {n.index} filled by a client holding leases and named tensors, which was {how}"


ALL = {
    "kill9_daemon": kill9_daemon, "kill9_daemon_in_gc": kill9_daemon_in_gc, "kill9_client": kill9_client,
    "kill9_gc": kill9_gc, "sigstop_peer": sigstop_peer, "corrupt_pack": corrupt_pack, "corrupt_bb": corrupt_bb,
    "io_fault": io_fault, "arena_full": arena_full,
}
# How often each is chosen in a run (sigstop_peer only with a group).
WEIGHTS = {"kill9_daemon": 40, "kill9_daemon_in_gc": 6, "kill9_client": 14, "kill9_gc": 5, "sigstop_peer": 6,
           "corrupt_pack": 8, "corrupt_bb": 8, "io_fault": 10, "arena_full": 4}
