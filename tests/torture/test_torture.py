"""The torture harness in the normal suite: short seeded runs against one daemon and a peer
group, the seeds that once found bugs (kept as regression cases), and checks that the oracle itself
catches what it must (a harness that cannot fail proves nothing).

The long runs (>= 1,000 kill points, the 64-client soak) are run by hand with tests/torture/run; their
figures are in docs/reliability.md.
"""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from content import check_model, tensor_bytes  # noqa: E402
from oracle import Oracle  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("CAIRN_SANITIZED") == "1",
                                reason="system suite (many daemons and clients): normal build only")


def torture(*args, timeout=900):
    r = subprocess.run([sys.executable, str(HERE / "torture.py"), *map(str, args)], capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, f"torture {' '.join(map(str, args))} failed:\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    return r.stdout


SEED = int(os.environ.get("CAIRN_TORTURE_SEED", "1001"))


def test_short_run_one_daemon():
    out = torture("--seed", SEED, "--duration", 25)
    assert "0 acknowledged models lost or wrong" in out


def test_short_run_peer_group():
    out = torture("--seed", SEED + 1, "--duration", 25, "--daemons", 3)
    assert "0 acknowledged models lost or wrong" in out


# Seeds that found a bug once, with what it was; each runs its first faults again.
REGRESSIONS = [
    (4, 3, 4, "three daemons on one repository: a model flushed after another daemon's later one was seen "
              "got a new created_ns, and its open readers failed with 'no longer the model this reader opened'"),
    (11, 1, 8, "two clients' gc at once in one daemon: the maintenance lease's temporary file was shared, and "
               "one gc failed with 'creating .../maintenance.lease: No such file or directory'"),
    (12, 1, 45, "EIO and torn writes on packs: a child acknowledged behind a parent whose write was retried "
                "was dropped; and gc beside kill -9s decided on a partial view and punched live chunks"),
    (4, 3, 40, "gc in a peer group: checkpoints covered a log only up to a record that could not be applied, "
               "so every open applied the later commits again, bringing back models gc had removed (naming "
               "freed bytes); gc then punched live chunks and fsck found whole ranges of packs damaged"),
]


@pytest.mark.parametrize("seed,daemons,faults,why", REGRESSIONS)
def test_regression(seed, daemons, faults, why):
    torture("--seed", seed, "--daemons", daemons, "--duration", 0, "--max-faults", faults)


def test_content_check_finds_one_wrong_byte():
    spec = {"tensors": {"a": ["m/a", 4096], "b": ["p/b", 100]}}
    good = {"a": tensor_bytes("m/a", 4096).copy(), "b": tensor_bytes("p/b", 100).copy()}
    assert check_model(good, spec) == ""
    good["a"][4095] ^= 1
    assert "offset 4095" in check_model(good, spec)
    assert "tensors" in check_model({"a": good["a"]}, spec)
    good["a"][4095] ^= 1
    assert "99 bytes, expected 100" in check_model({"a": good["a"], "b": np.zeros(99, np.uint8)}, spec)


def test_oracle_allows_only_memory_losses_after_a_kill():
    o = Oracle()
    for mid, level, t in (("m", "memory", 1.0), ("l", "local", 1.0), ("g", "global", 1.0), ("m2", "memory", 3.0)):
        o.intent(mid, {"tensors": {}}, node=0)
        o.ack(mid, level, t)
    o.intent("unacked", {"tensors": {}}, node=0)
    assert not o.may_be_lost("m")  # no kill yet
    o.killed(0, 2.0)
    assert o.may_be_lost("m") and not o.may_be_lost("m2")  # m2 was acknowledged after the kill
    assert not o.may_be_lost("l") and not o.may_be_lost("g")
    assert o.may_be_lost("unacked")
    o.flushed(0, 4.0)  # a flush that returned makes m2 global: a later kill cannot excuse its loss
    assert o.may_be_lost("m")  # but not m: it may have been lost by the kill before the flush
    o.killed(0, 5.0)
    assert not o.may_be_lost("m2")
    o.remove("g")
    assert o.may_be_lost("g")
    # Sent before a kill, its acknowledgement stamped after it (the reply waited in the socket).
    o.intent("late", {"tensors": {}}, node=0, t=5.5)
    o.killed(0, 5.6)
    o.ack("late", "memory", 5.7)
    assert o.may_be_lost("late")
    o.intent("after", {"tensors": {}}, node=0, t=5.8)
    o.ack("after", "memory", 5.9)
    assert not o.may_be_lost("after")


def test_a_read_refused_for_a_model_removed_during_the_check_is_not_a_violation():
    """check_one: a model its client removed while the pass ran may be refused with an error by a
    daemon whose view still listed it (seed 2712, 3 daemons); the same error for a live model is a
    violation, and wrong bytes always are."""
    from types import SimpleNamespace
    from torture import Run, cairn

    class Node:
        index = 0

        def __init__(self, exc):
            self.exc = exc

        def call(self, fn):
            raise self.exc

    def refused():
        return cairn.CorruptData("CAIRN_ERR_CORRUPTION", "corrupt data: chunk 00 has no intact copy in any tier")

    o = Oracle()
    for mid in ("gone", "live"):
        o.intent(mid, {"tensors": {}}, node=1)
        o.ack(mid, "global", 1.0)
    o.remove("gone")
    run = SimpleNamespace(oracle=o, removed_refusals=[])
    Run.check_one(run, Node(refused()), "gone", {"tensors": {}})
    assert o.violations == [] and o.counts.get("removed_meanwhile_read_refused") == 1
    assert len(run.removed_refusals) == 1 and "no intact copy" in run.removed_refusals[0]  # in the report
    Run.check_one(run, Node(refused()), "live", {"tensors": {}})
    assert len(o.violations) == 1 and "'live'" in o.violations[0]
