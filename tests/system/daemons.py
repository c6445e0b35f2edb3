"""A cairnd for the system tests: its own socket, repository and log in a temporary directory,
started and stopped (SIGTERM, then wait) by pid."""
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time


@contextlib.contextmanager
def cairnd(build, prefix, dram="256MiB"):
    d = tempfile.mkdtemp(prefix=prefix)
    sock = os.path.join(d, "cairnd.sock")
    cfg = os.path.join(d, "cairnd.yaml")
    with open(cfg, "w") as f:
        f.write("socket: %s\nrepository: %s/repo\ntiers:\n  dram:\n    capacity: %s\n" % (sock, d, dram))
    log_path = os.path.join(d, "cairnd.log")
    log = open(log_path, "w")
    p = subprocess.Popen([os.path.join(build, "bin", "cairnd"), "--config", cfg], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 30
        while not os.path.exists(sock) and time.time() < deadline:
            assert p.poll() is None, open(log_path).read()
            time.sleep(0.02)
        yield {"dir": d, "socket": sock, "pid": p.pid}
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=60)
        log.close()
        shutil.rmtree(d, ignore_errors=True)
