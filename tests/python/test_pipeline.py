"""Pipelined commits through the Python client when the daemon dies mid-pipeline: the tickets of
commits the daemon never answered raise Unavailable; nothing hangs."""
import os
import signal
import time

import numpy as np
import pytest

import cairn


def wait_until_stopped(pid, timeout=10.0):
    """kill(2) only queues SIGSTOP: a daemon thread already running can still answer a request
    before it stops. Wait until every thread of the process is in state T."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except FileNotFoundError:
                continue
        if states and all(s in ("T", "t") for s in states):
            return
        time.sleep(0.005)
    raise AssertionError(f"daemon {pid} did not stop within {timeout} s")


def test_daemon_dying_mid_pipeline_fails_tickets_without_hanging(make_daemon):
    d = make_daemon()
    c = cairn.connect(d.socket)
    try:
        c.save_model("base", {"w": np.arange(8, dtype=np.float32)}, wait=True)
        first = c.save_model("before", {}, parent="base", inherit_all=True, durability="memory")
        assert first.wait(timeout=30) == "memory"
        # The daemon stops reading: the commits below are written to the socket, never answered.
        os.kill(d.proc.pid, signal.SIGSTOP)
        wait_until_stopped(d.proc.pid)
        try:
            tickets = [c.save_model(f"m{i}", {}, parent="base", inherit_all=True, meta={"i": i},
                                    durability="memory") for i in range(50)]
            assert c.pipeline_in_flight == 50
        finally:
            d.proc.kill()  # SIGKILL works on a stopped process
            d.proc.wait()
        start = time.monotonic()
        for t in tickets:
            with pytest.raises(cairn.Unavailable, match="lost the connection"):
                t.wait(timeout=30)
            assert t.reached == "sent"
        assert time.monotonic() - start < 20
        with pytest.raises(cairn.Unavailable):
            c.pipeline_flush()
        with pytest.raises(cairn.Unavailable):
            c.save_model("late", {}, parent="base", inherit_all=True, durability="memory")
    finally:
        c.close()
