"""Multi-part models: one model written by several clients at once (docs/protocol.md, "Multi-part
models"), against a real cairnd: the model appears only when every part is in, exactly, in part
order; a part that never arrives (its writer killed before it committed) fails every other part's
ticket with an error naming it, and nothing of the model is ever visible."""
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import cairn


def shard(rank):
    rng = np.random.default_rng(rank)
    return {f"layer{rank}.weight": rng.standard_normal((64, 128)).astype(np.float32),
            f"layer{rank}.bias": np.full(128, rank, np.float32)}


def test_four_writers_make_one_model_visible_at_once(daemon):
    clients = [cairn.connect(daemon.socket) for _ in range(4)]
    try:
        clients[0].save_model("mp-base", shard(9), wait=True)
        tickets = []
        for rank in range(3):
            tickets.append(clients[rank].save_model("mp1", shard(rank), parent="mp-base", durability="memory",
                                                    part=(rank, 4), meta={"rank0": True} if rank == 0 else None))
            # Not visible while a part is missing.
            with pytest.raises(cairn.NotFound):
                clients[3].load_model("mp1")
        tickets.append(clients[3].save_model("mp1", shard(3), parent="mp-base", durability="global", part=(3, 4),
                                             inherit=["layer9.bias"]))
        for t in tickets:
            t.wait(timeout=60)
        got = clients[1].load_model("mp1", copy=True)
        expected = {}
        for rank in range(4):
            expected.update(shard(rank))
        assert list(got) == list(expected) + ["layer9.bias"]  # part order, then the inherited tensor
        for k, v in expected.items():
            np.testing.assert_array_equal(got[k], v)
        np.testing.assert_array_equal(got["layer9.bias"], shard(9)["layer9.bias"])
        info = clients[2].show("mp1")
        assert info["parent"] == "mp-base" and info["metadata"] == {"rank0": True}
        # The id is taken now, as any model's.
        with pytest.raises(cairn.AlreadyExists):
            clients[0].save_model("mp1", shard(0), wait=True)
    finally:
        for c in clients:
            c.close()


def test_a_waiting_part_returns_when_the_model_reaches_the_weakest_durability(daemon):
    a, b = cairn.connect(daemon.socket), cairn.connect(daemon.socket)
    try:
        done = {}

        def first():
            t0 = time.monotonic()
            a.save_model("mp-wait", shard(0), durability="global", part=(0, 2), wait=True)
            done["seconds"] = time.monotonic() - t0

        th = threading.Thread(target=first)
        th.start()
        time.sleep(0.5)
        assert th.is_alive(), "a waiting part returned before the model was complete"
        b.save_model("mp-wait", shard(1), durability="memory", part=(1, 2), wait=True)
        th.join(timeout=60)
        assert not th.is_alive() and done["seconds"] >= 0.5
        assert set(b.load_model("mp-wait")) == set(shard(0)) | set(shard(1))
    finally:
        a.close()
        b.close()


WRITER = textwrap.dedent("""
    import sys, time, numpy as np
    sys.path.insert(0, {pkg!r})
    import cairn
    c = cairn.connect({sock!r})
    print("connected", flush=True)
    time.sleep(600)   # killed here, before committing its part
""")


def test_a_part_whose_writer_was_killed_fails_the_others_and_nothing_is_visible(daemon, tmp_path):
    pkg = os.path.join(os.path.dirname(__file__), "..", "..", "api", "python")
    victim = subprocess.Popen([sys.executable, "-c", WRITER.format(pkg=os.path.abspath(pkg), sock=daemon.socket)],
                              stdout=subprocess.PIPE, universal_newlines=True, env=dict(os.environ))
    assert victim.stdout.readline().strip() == "connected"
    clients = [cairn.connect(daemon.socket) for _ in range(3)]
    try:
        t0 = time.monotonic()
        tickets = [clients[i].save_model("mp-dead", shard(r), durability="memory", part=(r, 4), part_timeout=1.5)
                   for i, r in enumerate((0, 1, 3))]
        victim.send_signal(signal.SIGKILL)  # rank 2 dies before committing
        victim.wait()
        for t in tickets:
            with pytest.raises(cairn.CairnError) as e:
                t.wait(timeout=60)
            assert "part 2 of 4" in str(e.value) and "did not arrive" in str(e.value), str(e.value)
        assert time.monotonic() - t0 < 30
        with pytest.raises(cairn.NotFound):
            clients[0].load_model("mp-dead")
        assert "mp-dead" not in [m["id"] if isinstance(m, dict) else m for m in clients[0].list()]
        # The id is free again, and the parts' arena space was given back.
        clients[0].save_model("mp-dead", shard(5), wait=True)
        assert list(clients[1].load_model("mp-dead")) == list(shard(5))
    finally:
        for c in clients:
            c.close()


def test_parts_that_disagree_are_refused(daemon):
    a, b = cairn.connect(daemon.socket), cairn.connect(daemon.socket)
    try:
        with pytest.raises(cairn.InvalidArgument):
            a.save_model("mp-bad", shard(0), part=(4, 4))
        t = a.save_model("mp-bad", shard(0), durability="memory", part=(0, 3), part_timeout=5)
        with pytest.raises(cairn.InvalidArgument, match="earlier part said the model has 3 parts"):
            b.save_model("mp-bad", shard(1), durability="memory", part=(1, 2))
        with pytest.raises(cairn.InvalidArgument, match="committed twice"):
            b.save_model("mp-bad", shard(1), durability="memory", part=(0, 3))
        # A tensor name in two parts: the model is not created, every part learns why.
        t1 = b.save_model("mp-bad", shard(0), durability="memory", part=(1, 3))
        t2 = b.save_model("mp-bad", shard(2), durability="memory", part=(2, 3))
        for tk in (t, t1, t2):
            with pytest.raises(cairn.InvalidArgument, match="is in parts 0 and 1"):
                tk.wait(timeout=30)
        with pytest.raises(cairn.NotFound):
            a.load_model("mp-bad")
    finally:
        a.close()
        b.close()


def test_pipelined_parts_return_at_once_and_their_errors_come_from_the_ticket(daemon):
    clients = [cairn.connect(daemon.socket) for _ in range(3)]
    try:
        data = {r: np.full((512, 1024), r + 1, np.float32) for r in range(3)}
        tickets = [clients[r].save_model("mp-pipe", {f"w{r}": data[r]}, durability="local", part=(r, 3),
                                         pipelined=True) for r in range(3)]
        assert all(t.reached == "sent" for t in tickets)
        for t in tickets:
            assert t.wait(timeout=60) == "local"
        got = clients[0].load_model("mp-pipe", copy=True)
        assert list(got) == ["w0", "w1", "w2"]
        assert all(np.array_equal(got[f"w{r}"], data[r]) for r in range(3))
        # The id is taken: the pipelined part's own error is raised by its ticket, not by the call.
        t = clients[1].save_model("mp-pipe", shard(1), durability="local", part=(0, 2), pipelined=True)
        with pytest.raises(cairn.AlreadyExists):
            t.wait(timeout=60)
        # A plain pipelined commit above memory.
        t = clients[2].save_model("pipe-global", shard(2), durability="global", pipelined=True)
        assert t.wait(timeout=60) == "global"
        t = clients[2].save_model("pipe-global", shard(2), durability="global", pipelined=True)
        with pytest.raises(cairn.AlreadyExists):
            t.wait(timeout=60)
        assert np.array_equal(clients[1].load_model("pipe-global", copy=True)["layer2.weight"], shard(2)["layer2.weight"])
    finally:
        for c in clients:
            c.close()
