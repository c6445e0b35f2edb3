"""What the Python workload scripts share: a cairnd they start and stop by pid, and dropping the
page cache before a cold measurement."""
import os
import signal
import socket
import subprocess
import time
from pathlib import Path


class Daemon:
    """A cairnd on its own socket and repository under root (cairnd.sock, repo/, cairnd.log);
    `policy` is the YAML body of the config's policy section ("" = the defaults); `extra`, top-level
    YAML lines added to the config (e.g. "repository_compression: off\n")."""

    def __init__(self, build: Path, root: Path, dram: str, policy: str = "", extra: str = ""):
        self.build = build
        self.root = root
        self.socket = str(root / "cairnd.sock")
        self.config = root / "cairn.yaml"
        self.config.write_text(f"socket: {self.socket}\nrepository: {root / 'repo'}\n" + extra
                               + f"tiers:\n  dram:\n    capacity: {dram}\n"
                               + (f"policy:\n{policy}" if policy else "")
                               + f"log:\n  level: {os.environ.get('CAIRN_BENCH_LOG_LEVEL', 'warn')}\n"
                               + f"  file: {root / 'cairnd.log'}\n")
        self.proc = None

    def start(self, backed: bool = True):
        """Starts cairnd and returns once it answers; with `backed` (the default) once it has also
        backed its arena with memory (wait_arena_backed), as a daemon that the job's prologue started
        has long before the job's first call. Without it a measurement made in the first seconds
        shares the node with the daemon zeroing its arena (about 1 s per GiB here). A benchmark that
        times the start itself passes backed=False."""
        self.proc = subprocess.Popen([str(self.build / "bin" / "cairnd"), "--config", str(self.config)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        why = wait_started(self.proc, self.socket, 60, backed)
        if why == "exited":
            raise RuntimeError("cairnd exited: " + self.proc.stderr.read().decode())
        if why:
            raise RuntimeError("cairnd did not start")
        return self

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=120)


def wait_started(proc, socket_path: str, timeout: float, backed: bool) -> str:
    """Waits until the cairnd `proc` answers on socket_path and, with `backed`, has backed its arena
    (wait_arena_backed). Returns "" then, "exited" when it exited first, "timeout" when `timeout`
    seconds passed."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            return "exited"
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(socket_path)
            s.close()
        except OSError:
            time.sleep(0.02)
            continue
        if backed:
            wait_arena_backed(socket_path)
        return ""
    return "timeout"


def wait_arena_backed(socket_path: str, timeout: float = 300.0) -> float:
    """Waits until the daemon on socket_path has backed its whole DRAM arena with memory (its
    background pass at start, `tiers.dram.prefault_finished` in its stats), as a daemon that a job's
    prologue started has long before the job's first commit; returns the seconds waited. On a machine
    that must compact memory for each 2 MiB page this takes seconds per GiB, and a commit into pages
    not backed yet pays for it."""
    import cairn

    t0 = time.time()
    with cairn.connect(socket_path) as c:
        while not c.stats()["tiers"]["dram"].get("prefault_finished", True):
            if time.time() - t0 > timeout:
                raise RuntimeError(f"cairnd on {socket_path} did not back its arena within {timeout:.0f} s")
            time.sleep(0.05)
    return time.time() - t0


def drop_caches(files, only_files: bool = False) -> str:
    """Drops the page cache (as root: drop_caches; else, or with `only_files`,
    posix_fadvise(DONTNEED) on each of `files`); returns how."""
    os.sync()
    try:
        if only_files:
            raise OSError("only the files")
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        for p in files:
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        return "fadvise(DONTNEED)"


def print_rows(rows) -> None:
    """One line per row of a workload's JSON (name, value, baseline, ratio, goal, met)."""
    for x in rows:
        met = {True: "met", False: "MISSED", None: ""}[x["met"]]
        print(f"{x['name']}: {x['value']:.4g} {x['unit']} vs {x['baseline']} {x['baseline_value']:.4g} {x['unit']}: "
              f"ratio {x['ratio']:.3g} (goal {x['goal'] or '-'}) {met}")
