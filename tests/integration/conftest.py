"""Fixtures for integration tests: real cairnd processes and the real `cairn` tool.

Every daemon is started by pid with its own socket, repository and config under a temp directory,
and is stopped (SIGTERM, then SIGKILL after a timeout) when the test ends.
"""
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

BUILD = Path(os.environ.get("CAIRN_BUILD_DIR", Path(__file__).resolve().parents[2] / "build"))
SOURCE = Path(os.environ.get("CAIRN_SOURCE_DIR", Path(__file__).resolve().parents[2]))
CAIRND = BUILD / "bin" / "cairnd"
CAIRN = BUILD / "bin" / "cairn"
LIBCAIRN = BUILD / "lib" / "libcairn.so"


class Daemon:
    def __init__(self, root: Path, dram="256MiB", extra_config="", env=None):
        self.root = root
        self.socket = str(root / "run" / "cairnd.sock")
        self.repo = root / "repo"
        self.config = root / "cairn.yaml"
        self.config.write_text(
            f"socket: {self.socket}\nrepository: {self.repo}\n"
            f"tiers:\n  dram:\n    capacity: {dram}\n"
            f"log:\n  level: warn\n  file: {root / 'cairnd.log'}\n" + extra_config
        )
        self.env = dict(os.environ, CAIRN_SOCKET=self.socket)
        self.env.update(env or {})
        self.proc = None

    def start(self, timeout=30):
        self.proc = subprocess.Popen(
            [str(CAIRND), "--config", str(self.config)],
            env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                out, err = self.proc.communicate()
                raise RuntimeError(f"cairnd exited with {self.proc.returncode}: {err.decode()}")
            try:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(self.socket)
                s.close()
                return self
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("cairnd did not start listening in time")

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        self.proc.communicate()
        return self.proc.returncode

    def kill9(self):
        self.proc.kill()
        self.proc.wait()
        self.proc.communicate()

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def cairn(self, *args, check=True, timeout=300):
        r = subprocess.run([str(CAIRN), *map(str, args)], env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"cairn {' '.join(map(str, args))} failed ({r.returncode}): {r.stderr}")
        return r

    def stats(self):
        return json.loads(self.cairn("stats", "--json").stdout)


@pytest.fixture
def tmp(tmp_path_factory):
    # Short paths: Unix socket paths are limited to 107 bytes.
    d = Path(tempfile.mkdtemp(prefix="cairn-it-", dir="/tmp"))
    yield d
    if not os.environ.get("CAIRN_KEEP_TMP"):  # keep it to read the daemons' logs after a failure
        subprocess.run(["rm", "-rf", str(d)])


@pytest.fixture
def make_daemon(tmp):
    daemons = []

    def make(name="d", **kw):
        root = tmp / name
        root.mkdir(exist_ok=True)
        d = Daemon(root, **kw)
        daemons.append(d)
        return d

    yield make
    for d in daemons:
        if d.alive():
            d.proc.kill()
            d.proc.wait()


@pytest.fixture
def daemon(make_daemon):
    return make_daemon().start()


def ctypes_env(env):
    """The environment for a Python process that loads libcairn.so with ctypes. A sanitized build's
    library needs the sanitizer runtimes preloaded (Python itself is not built with them)."""
    env = dict(env)
    if os.environ.get("CAIRN_SANITIZED") == "1":
        libs = [subprocess.run(["cc", f"-print-file-name={lib}"], capture_output=True, text=True).stdout.strip()
                for lib in ("libasan.so", "libubsan.so")]
        env["LD_PRELOAD"] = " ".join(libs)
        env["ASAN_OPTIONS"] = "detect_leaks=0"
    return env
