"""Servers for the system tests, each with its own socket and log in a temporary directory, started
and stopped (SIGTERM, then wait) by pid: a cairnd (with its repository), and a redis-server for the
Redis baselines."""
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time


@contextlib.contextmanager
def _server(args, d, sock, log_path, what):
    """Runs args (logging to log_path) until the block ends; yields once sock exists."""
    log = open(log_path, "w")
    p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 30
        while not os.path.exists(sock) and time.time() < deadline:
            assert p.poll() is None, "%s exited at start:\n%s" % (what, open(log_path).read())
            time.sleep(0.02)
        yield {"dir": d, "socket": sock, "pid": p.pid}
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=60)
        log.close()
        shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def cairnd(build, prefix, dram="256MiB"):
    d = tempfile.mkdtemp(prefix=prefix)
    sock = os.path.join(d, "cairnd.sock")
    cfg = os.path.join(d, "cairnd.yaml")
    with open(cfg, "w") as f:
        f.write("socket: %s\nrepository: %s/repo\ntiers:\n  dram:\n    capacity: %s\n" % (sock, d, dram))
    with _server([os.path.join(build, "bin", "cairnd"), "--config", cfg], d, sock, os.path.join(d, "cairnd.log"),
                 "cairnd") as s:
        yield s


@contextlib.contextmanager
def redis_server(prefix):
    """redis-server on a Unix socket only, without persistence (--save "" --appendonly no)."""
    d = tempfile.mkdtemp(prefix=prefix)
    sock = os.path.join(d, "redis.sock")
    args = [shutil.which("redis-server") or "redis-server", "--port", "0", "--unixsocket", sock, "--unixsocketperm",
            "700", "--save", "", "--appendonly", "no", "--dir", d]
    with _server(args, d, sock, os.path.join(d, "redis.log"), "redis-server") as s:
        yield s
