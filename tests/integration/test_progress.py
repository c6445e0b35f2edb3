"""Progress of the `cairn` tool's long commands: a line redrawn in place on a terminal, plain lines
with --progress on a pipe, nothing on a pipe without it; the daemon's own long requests (fsck here)
report real counts through the `progress` request."""
import os
import pty
import re
import select
import subprocess
import time

import numpy as np

from conftest import CAIRN
from stfiles import write_raw

MiB = 1 << 20
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def amount_done(line, prefix):
    """The bytes done in a progress line "PREFIX12.5 MiB / ..."."""
    m = re.match(re.escape(prefix) + r"([0-9.]+) (B|KiB|MiB|GiB) / ", line)
    assert m, line
    return float(m.group(1)) * UNITS[m.group(2)]


def big_file(path, mib, seed=0):
    """A safetensors file of `mib` MiB in 16 MiB tensors of distinct random bytes."""
    rng = np.random.default_rng(seed)
    tensors = [(f"layer{i}.weight", "U8", (16 * MiB,), rng.bytes(16 * MiB)) for i in range(mib // 16)]
    write_raw(path, tensors)
    return path


def test_import_with_progress_on_a_pipe_prints_plain_lines_and_a_summary(make_daemon, tmp):
    d = make_daemon(dram="1GiB").start()
    src = big_file(tmp / "big.safetensors", 320)
    t0 = time.monotonic()
    r = d.cairn("import", "big", src, "--progress")
    assert time.monotonic() - t0 < 10
    assert "\r" not in r.stderr and "\x1b" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) >= 3, r.stderr  # reading, committing, summary at least
    reading = [l for l in lines if l.startswith(f"import big: reading {src}: ")]
    assert reading, r.stderr
    assert "/ 320.0 MiB" in reading[0]
    done = [amount_done(l, f"import big: reading {src}: ") for l in reading]
    assert done == sorted(done)
    assert any(l.startswith("import big: committing") for l in lines), r.stderr
    assert lines[-1] == f"import big: 320.0 MiB from {src} committed (global)"
    assert r.stdout == ""


def test_import_on_a_pipe_without_progress_prints_nothing_extra(make_daemon, tmp):
    d = make_daemon(dram="1GiB").start()
    src = big_file(tmp / "big.safetensors", 64)
    r = d.cairn("import", "big", src)
    assert r.stderr == "" and r.stdout == ""
    r = d.cairn("export", "big", tmp / "out.safetensors")
    assert r.stderr == "" and r.stdout == ""
    assert (tmp / "out.safetensors").read_bytes() == src.read_bytes()
    # --quiet wins over --progress.
    r = d.cairn("fsck", "--progress", "--quiet")
    assert r.stderr == ""


def run_on_a_terminal(env, *args, timeout=20):
    """Runs the tool with stderr on a pseudo-terminal; returns (exit status, what the terminal got)."""
    master, slave = pty.openpty()
    p = subprocess.Popen([str(CAIRN), *map(str, args)], env=env, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    out = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the other side closed
                    break
                if not chunk:
                    break
                out += chunk
            elif p.poll() is not None:
                break
        rc = p.wait(timeout=max(1, deadline - time.monotonic()))
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        os.close(master)
    return rc, out.decode(errors="replace")


def test_import_on_a_terminal_redraws_one_line_in_place(make_daemon, tmp):
    d = make_daemon(dram="1GiB").start()
    src = big_file(tmp / "big.safetensors", 160)
    rc, out = run_on_a_terminal(d.env, "import", "big", src)
    assert rc == 0, out
    assert out.startswith("\r") and "\x1b[K" in out, repr(out)
    redraws = out.count("\r") - out.count("\r\n")
    assert redraws >= 2, repr(out)
    # One finished line: the summary, which replaces the progress line.
    assert out.rstrip("\r\n").endswith(f"import big: 160.0 MiB from {src} committed (global)"), repr(out)
    assert out.count("\n") == 1, repr(out)


def test_fsck_shows_the_daemons_real_progress(make_daemon, tmp):
    d = make_daemon(dram="1GiB", extra_config="debug:\n  fault_injection: true\n").start()
    d.cairn("import", "m", big_file(tmp / "m.safetensors", 128))  # 8 chunks of 16 MiB
    # Every chunk read from the repository's packs takes 200 ms more: fsck --verify takes 1.6 s.
    d.cairn("fault", "add", "--op", "read", "--path", "/packs/", "--effect", "delay", "--delay-ms", "200",
            "--times", "1000")
    r = d.cairn("fsck", "--progress", timeout=30)
    assert "fsck: 1 models" in r.stdout, r.stdout
    lines = r.stderr.strip().splitlines()
    verifying = [l for l in lines if l.startswith("fsck: verifying chunks: ")]
    assert len(verifying) >= 3, r.stderr
    done = [amount_done(l, "fsck: verifying chunks: ") for l in verifying]
    assert all("/ 128.0 MiB" in l for l in verifying), r.stderr
    assert len(set(done)) >= 3 and done == sorted(done), r.stderr
    assert lines[-1].startswith("fsck: 8 chunk references, 128.0 MiB verified in "), r.stderr


def test_gc_without_a_terminal_or_progress_prints_only_its_result(daemon):
    r = daemon.cairn("gc")
    assert r.stderr == ""
    assert r.stdout.startswith("gc: removed 0 retired models")
