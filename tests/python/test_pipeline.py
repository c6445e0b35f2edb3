"""Pipelined commits through the Python client when the daemon dies mid-pipeline: the tickets of
commits the daemon never answered raise Unavailable; nothing hangs."""
import os
import signal
import time

import numpy as np
import pytest

import cairn


def test_daemon_dying_mid_pipeline_fails_tickets_without_hanging(make_daemon):
    d = make_daemon()
    c = cairn.connect(d.socket)
    try:
        c.save_model("base", {"w": np.arange(8, dtype=np.float32)}, wait=True)
        first = c.save_model("before", {}, parent="base", inherit_all=True, durability="memory")
        assert first.wait(timeout=30) == "memory"
        # The daemon stops reading: the commits below are written to the socket, never answered.
        os.kill(d.proc.pid, signal.SIGSTOP)
        try:
            tickets = [c.save_model(f"m{i}", {}, parent="base", inherit_all=True, meta={"i": i},
                                    durability="memory") for i in range(50)]
            assert c.in_flight == 50
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
            c.flush_pipeline()
        with pytest.raises(cairn.Unavailable):
            c.save_model("late", {}, parent="base", inherit_all=True, durability="memory")
    finally:
        c.close()
