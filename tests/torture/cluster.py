"""The daemons a torture run drives: one cairnd, or a peer group of several on 127.0.0.x sharing one
repository, each with its own socket, arena, burst buffer and log, started and stopped by pid."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("CAIRN_BUILD_DIR", SOURCE / "build"))
CAIRND = BUILD / "bin" / "cairnd"
CAIRN = BUILD / "bin" / "cairn"
LIBCAIRN = BUILD / "lib" / "libcairn.so"

sys.path.insert(0, str(SOURCE / "api" / "python"))
os.environ.setdefault("CAIRN_LIBRARY", str(LIBCAIRN))
import cairn  # noqa: E402


def client_env():
    """The environment of a worker process: the package and the library of this build."""
    env = dict(os.environ, CAIRN_LIBRARY=str(LIBCAIRN))
    env["PYTHONPATH"] = os.pathsep.join([str(SOURCE / "api" / "python"), env.get("PYTHONPATH", "")])
    return env


class Node:
    """One cairnd of the run."""

    def __init__(self, root: Path, index: int, repo: Path, group: int, dram: str, nvme: str, peer_timeout: str,
                 watchdog: str, faults: bool, job: str = "torture"):
        self.index = index
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.socket = str(root / "run" / "cairnd.sock")
        self.log = root / "cairnd.log"
        self.config = root / "cairn.yaml"
        peers = (f"peers:\n  job: \"{job}\"\n  rendezvous: {repo.parent / 'rdv'}\n  provider: \"tcp;ofi_rxm\"\n"
                 f"  address: 127.0.0.{index + 1}\n  timeout: {peer_timeout}\n") if group > 1 else "peers:\n  job: none\n"
        self.config.write_text(
            f"socket: {self.socket}\nrepository: {repo}\nchunk_size: 1MiB\nrepository_refresh: 500ms\n"
            f"tiers:\n  dram:\n    capacity: {dram}\n  nvme:\n    path: {root / 'nvme'}\n    capacity: {nvme}\n"
            f"    persistent: true\n" + peers + (f"watchdog: {watchdog}\n" if watchdog else "") +
            f"log:\n  level: info\n  file: {self.log}\n")
        self.env = dict(os.environ, CAIRN_SOCKET=self.socket)
        if faults:
            self.env["CAIRN_DEBUG_FAULT_INJECTION"] = "1"
        self.proc = None
        self.stopped = False  # SIGSTOPped
        self._client = None
        self.starts = 0

    # ---- lifecycle ----
    def start(self, timeout=60):
        self._client = None
        with open(self.root / "cairnd.out", "ab") as out:
            self.proc = subprocess.Popen([str(CAIRND), "--config", str(self.config)], env=self.env,
                                         stdout=out, stderr=subprocess.STDOUT)
        self.starts += 1
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"cairnd {self.index} exited with {self.proc.returncode} at start: "
                                   f"{self.tail()}")
            try:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(self.socket)
                s.close()
                return self
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"cairnd {self.index} did not listen within {timeout} s: {self.tail()}")

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill9(self):
        if self.stopped:
            self.cont()
        self.proc.kill()
        self.proc.wait()
        self._drop_client()

    def term(self, timeout=120):
        """SIGTERM (drains to the repository); the exit status."""
        if self.stopped:
            self.cont()
        self._drop_client()
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None

    def stop(self):
        os.kill(self.proc.pid, signal.SIGSTOP)
        self.stopped = True

    def cont(self):
        os.kill(self.proc.pid, signal.SIGCONT)
        self.stopped = False

    # ---- talking to it ----
    def client(self):
        if self._client is None or self._client.closed:
            self._client = cairn.connect(self.socket)
        return self._client

    def _drop_client(self):
        c, self._client = self._client, None
        if c is not None:
            try:
                c.close()
            except Exception:
                pass

    def call(self, fn, retries=3):
        """fn(client), reconnecting once the daemon restarted under it."""
        for attempt in range(retries):
            try:
                return fn(self.client())
            except (cairn.Unavailable, cairn.ProtocolError):
                self._drop_client()
                if attempt == retries - 1:
                    raise
                time.sleep(0.1)

    def stats(self):
        return self.call(lambda c: c.stats())

    def cairn(self, *args, timeout=300):
        return subprocess.run([str(CAIRN), *map(str, args)], env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    # ---- what it costs ----
    def rss_bytes(self):
        """The daemon's own resident memory: RssAnon (heap, stacks), without the arena (shared
        memory, all of it resident from the start) and mapped files."""
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def open_fds(self):
        try:
            return len(os.listdir(f"/proc/{self.proc.pid}/fd"))
        except OSError:
            return 0

    def tail(self, n=40):
        text = ""
        for p in (self.log, self.root / "cairnd.out"):
            if p.exists():
                text += "\n".join(p.read_text(errors="replace").splitlines()[-n:]) + "\n"
        return text


def wait_group(nodes, timeout=30):
    """Until every member of a peer group has verified the others."""
    if len(nodes) < 2:
        return
    deadline = time.time() + timeout
    while time.time() < deadline:
        ok = True
        for n in nodes:
            r = n.cairn("peers", "--json")
            if r.returncode != 0:
                ok = False
                break
            members = json.loads(r.stdout)["members"]
            if sum(m["state"] == "verified" for m in members) < len(nodes) - 1:
                ok = False
                break
        if ok:
            return
        time.sleep(0.2)
    raise RuntimeError("the peer group did not form: " + " | ".join(n.cairn("peers", "--json").stdout[:500]
                                                                     for n in nodes))
