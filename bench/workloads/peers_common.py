"""What the peer-group benchmarks share (bench/workloads/peers_bench.py, peers_spread.py): daemons
as members of a peer group on one machine (each its own socket, arena and 127.0.0.x address, one
repository), started and stopped by pid, and the models they load.
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("CAIRN_BUILD_DIR", ROOT / "build"))
sys.path.insert(0, str(ROOT / "api" / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("CAIRN_LIBRARY", str(BUILD / "lib" / "libcairn.so"))
import cairn  # noqa: E402
from bench_daemon import wait_started  # noqa: E402

MiB = 1 << 20
BERT_BASE_BYTES = 440_473_133  # bert-base-uncased pytorch_model.bin (fp32), as in peers_sim.py
PROVIDER = "tcp;ofi_rxm"
PEER_TIMEOUT = "5s"  # peers.timeout: generous, the machine is shared and small
PFS_AGGREGATE_BPS = 100e9  # the simulation's assumption: a mid-size Lustre
SIM_NODES = [16 << i for i in range(9)]  # 16 .. 4096

_started = []  # every daemon this driver started, stopped in main's finally
_lock = threading.Lock()


def _daemon_env(sock):
    """The environment without any CAIRN_* override of the config (a CAIRN_SOCKET or CAIRN_PEERS_JOB
    of the caller must not reach the daemons), plus the socket for the `cairn` CLI."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_") or k == "CAIRN_LIBRARY"}
    for k in ("SLURM_JOB_ID", "PBS_JOBID"):  # the group is always named in the config here
        env.pop(k, None)
    env["CAIRN_SOCKET"] = sock
    return env


class Member:
    """A cairnd under `root` on the shared repository `repo`; with `job` a member of that peer group
    on 127.0.0.<index>, else outside any group (peers.job: none)."""

    def __init__(self, root, repo, index, dram_bytes, chunk, job=None, rendezvous=None, provider=PROVIDER):
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.name = root.name
        self.socket = str(root / "cairnd.sock")
        self.env = _daemon_env(self.socket)
        # shm names its endpoints itself (no IP address to bind).
        address = "" if provider == "shm" else f"  address: 127.0.0.{index}\n"
        peers = (f"peers:\n  job: \"{job}\"\n  rendezvous: {rendezvous}\n  provider: \"{provider}\"\n"
                 f"{address}  timeout: {PEER_TIMEOUT}\n") if job else "peers:\n  job: none\n"
        self.config = root / "cairn.yaml"
        self.config.write_text(f"socket: {self.socket}\nrepository: {repo}\nchunk_size: {chunk // MiB}MiB\n"
                               f"tiers:\n  dram:\n    capacity: {dram_bytes // MiB}MiB\n" + peers +
                               f"log:\n  level: warn\n  file: {root / 'cairnd.log'}\n")
        self.proc = None
        self._err = None

    def start(self, timeout=90, backed=True):
        """Returns once the daemon answers and (with `backed`) has backed its arena with memory, as
        the job's prologue leaves it (bench/README.md): several members zeroing their arenas beside
        a timed load would be measured as that load's cost."""
        self._err = open(self.root / "stderr.txt", "wb")
        self.proc = subprocess.Popen([str(BUILD / "bin" / "cairnd"), "--config", str(self.config)], env=self.env,
                                     stdout=subprocess.DEVNULL, stderr=self._err)
        with _lock:
            _started.append(self)
        why = wait_started(self.proc, self.socket, timeout, backed)
        if why == "exited":
            raise RuntimeError(f"cairnd {self.name} exited with {self.proc.returncode}: {self.tail()}")
        if why:
            raise RuntimeError(f"cairnd {self.name} did not start within {timeout} s: {self.tail()}")
        return self

    def tail(self):
        out = []
        for f in ("stderr.txt", "cairnd.log"):
            p = self.root / f
            if p.exists():
                out.append(p.read_text(errors="replace")[-1500:])
        return " | ".join(out)

    def signal_stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait_stopped(self, timeout=60):
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # this daemon's pid only
            self.proc.wait()
        if self._err:
            self._err.close()
            self._err = None

    def cli(self, *args):
        r = subprocess.run([str(BUILD / "bin" / "cairn"), *args], env=self.env, capture_output=True, text=True,
                           timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"cairn {' '.join(args)} on {self.name} failed ({r.returncode}): {r.stderr.strip()}")
        return json.loads(r.stdout)

    def movement(self):
        return self.cli("stats", "--json").get("movement", {})

    def peers(self):
        return self.cli("peers", "--json")


def stop_all(members):
    for m in members:
        m.signal_stop()
    for m in members:
        m.wait_stopped()


def wait_verified(members, timeout=90):
    """Until every member has verified all the others (`cairn peers --json`)."""
    n = len(members)
    deadline = time.time() + timeout
    views = []
    while time.time() < deadline:
        views = [m.peers() for m in members]
        if all(sum(x.get("state") == "verified" for x in v.get("members", [])) == n - 1 for v in views):
            return
        time.sleep(0.1)
    raise RuntimeError(f"the {n} members did not verify each other within {timeout} s: "
                       + json.dumps([[(x.get("id"), x.get("state")) for x in v.get("members", [])] for v in views]))


def make_model(nbytes, tensors, seed):
    """`tensors` float32 tensors of random bits, nbytes in all (rounded down to whole floats)."""
    per = nbytes // tensors // 4
    rng = np.random.default_rng(seed)
    return {f"layer{i}.weight": np.frombuffer(rng.bytes(per * 4), dtype=np.float32) for i in range(tensors)}


def model_bytes(m):
    return sum(v.nbytes for v in m.values())


def same(got, want):
    """Byte-exact (random bits include NaNs, so compare as integers)."""
    return list(got) == list(want) and all(
        got[k].nbytes == v.nbytes and np.array_equal(got[k].view(np.uint32), v.view(np.uint32)) for k, v in want.items())


def wait_visible(client, mid, timeout=30):
    """Until model `mid` (committed through another daemon) is known here; the load is timed after."""
    deadline = time.time() + timeout
    while True:
        try:
            client.show(mid)
            return
        except cairn.CairnError:
            if time.time() > deadline:
                raise
            time.sleep(0.05)


def repo_files(repo):
    return [os.path.join(d, f) for d, _, fs in os.walk(repo) for f in fs if ".peers" not in d]


def arena_for(nbytes):
    """A DRAM arena that holds the model: 1.25 x, at least 128 MiB, whole MiB."""
    return max(128 * MiB, -(-int(nbytes * 1.25) // MiB) * MiB)


def stop_started():
    """Stops every daemon started here (by pid); returns the names of those that would not stop."""
    with _lock:
        started = list(_started)
    stop_all(started)
    return [m.name for m in started if m.proc is not None and m.proc.poll() is None]
