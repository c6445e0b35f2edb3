"""Swift/T with cairn's leaf functions (workflow/swift/cairn.swift over the Tcl package built from
workflow/swift/tclcairn.cpp) against a real cairnd. Checks that the NAS example
(workflow/examples/nas.swift) on 3 ranks commits every candidate with its parent, score and exact
bytes and sends its hints (counted by the daemon, every id known); that a blob put in one leaf is read
in another; and that a run without a daemon fails at once, naming the socket.

Needs a Swift/T the site has installed: $CAIRN_SWIFT_T (the swift-t executable, or an install prefix
holding stc/bin/swift-t or bin/swift-t), else `swift-t` on PATH; without either the module skips,
saying so. Swift/T is not packaged by Debian, and this project never builds it. Also needs the Tcl
package in $CAIRN_BUILD_DIR/lib/tcl/cairn (CAIRN_WITH_TCL, tcl-dev) and Open MPI for Turbine's ranks.
"""
import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from safetensors.numpy import load_file

from daemons import cairnd

SOURCE = os.environ.get("CAIRN_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
BUILD = os.environ.get("CAIRN_BUILD_DIR", os.path.join(SOURCE, "build"))
PKG = os.path.join(BUILD, "lib", "tcl", "cairn")
PYTHON = sys.executable


def swift_t():
    """The site's swift-t: $CAIRN_SWIFT_T, else PATH. Skips when neither names one; fails when
    $CAIRN_SWIFT_T is set but holds no swift-t (a misconfiguration, not an absence)."""
    given = os.environ.get("CAIRN_SWIFT_T")
    if given:
        for exe in (given, os.path.join(given, "stc", "bin", "swift-t"), os.path.join(given, "bin", "swift-t")):
            if os.path.isfile(exe) and os.access(exe, os.X_OK):
                return os.path.abspath(exe)
        pytest.fail("CAIRN_SWIFT_T=%s is neither the swift-t executable nor a Swift/T prefix holding "
                    "stc/bin/swift-t or bin/swift-t" % given)
    exe = shutil.which("swift-t")
    if not exe:
        pytest.skip("Swift/T is not installed: no swift-t on PATH and CAIRN_SWIFT_T is not set (Swift/T "
                    "is not packaged by Debian; install it from its own source or Spack and put swift-t "
                    "on PATH)")
    return exe


@pytest.fixture(scope="module")
def swift():
    exe = swift_t()
    assert os.path.exists(os.path.join(PKG, "libtclcairn.so")), \
        "the Tcl package was not built (%s): is tcl-dev installed? (scripts/deps installs it)" % PKG
    return exe


@pytest.fixture(scope="module")
def daemon():
    with cairnd(BUILD, "cairn-swift-") as d:
        yield d


def run_swift(swift, script, args, socket, cwd, timeout=300):
    env = dict(os.environ, CAIRN_SOCKET=socket, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               TURBINE_LAUNCH_OPTIONS="--oversubscribe")
    t0 = time.time()
    p = subprocess.run([swift, "-I", PKG, "-r", PKG, "-n", "3", script] + args, env=env, cwd=cwd,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=timeout)
    return p, time.time() - t0


def cairn(daemon, *args):
    p = subprocess.run([os.path.join(BUILD, "bin", "cairn")] + list(args), env=dict(os.environ, CAIRN_SOCKET=daemon["socket"]),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    assert p.returncode == 0, p.stdout
    return p.stdout


def test_nas_swift_on_three_ranks_commits_candidates_with_their_parents(swift, daemon, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    base = tmp_path / "base.safetensors"
    cand = os.path.join(SOURCE, "workflow", "examples", "nas_swift_candidate.py")
    subprocess.run([PYTHON, cand, "--init", str(base)], check=True)
    script = tmp_path / "nas.swift"  # swift-t writes its .tic beside the script: a copy in tmp
    script.write_text(open(os.path.join(SOURCE, "workflow", "examples", "nas.swift")).read())
    G, C = 2, 3
    hints_before = json.loads(cairn(daemon, "stats", "--json"))["prefetch"]
    p, secs = run_swift(swift, str(script), ["--work=%s" % work, "--base=%s" % base, "--python=%s" % PYTHON,
                                             "--script=%s" % cand, "--generations=%d" % G, "--candidates=%d" % C,
                                             "--prefix=sw"], daemon["socket"], str(tmp_path))
    assert p.returncode == 0, p.stdout
    best = {}
    for line in p.stdout.splitlines():
        if line.startswith("generation "):
            g = int(line.split()[1].rstrip(":"))
            best[g] = line.split("best ")[1].split()[0]
    assert sorted(best) == [1, 2], p.stdout
    final = [ln for ln in p.stdout.splitlines() if ln.startswith("best: ")]
    assert final and final[0].split()[1] == best[2], p.stdout
    assert final[0].split("lineage: ")[1].split() == [best[1], "sw-g0"], final
    # The hints reached the daemon: a population per generation, a will_load for generation 2's
    # parent; every id known.
    answers = {}
    for line in p.stdout.splitlines():
        if line.startswith("hint "):
            kind, g, answer = line.split(" ", 3)[1:]
            answers[(kind, int(g.rstrip(":")))] = json.loads(answer)
    assert sorted(answers) == [("population", 1), ("population", 2), ("will_load", 1)], p.stdout
    for (kind, g), a in answers.items():
        assert a["kind"] == kind and a["unknown"] == [] and a["models"] == (C if kind == "population" else 1), a
    assert answers[("will_load", 1)]["queued"] == 1
    hints_after = json.loads(cairn(daemon, "stats", "--json"))["prefetch"]
    assert hints_after["hints"] - hints_before["hints"] == 3, (hints_before, hints_after)
    assert hints_after["unknown_models"] == hints_before["unknown_models"]
    parents = {1: "sw-g0", 2: best[1]}
    for g in (1, 2):
        scores = {}
        for c in range(C):
            mid = "sw-g%d-c%d" % (g, c)
            show = json.loads(cairn(daemon, "show", mid))
            assert show["parent"] == parents[g], show
            scores[mid] = show["metadata"]["score"]
            # The model reads back exactly what the candidate wrote.
            out = tmp_path / (mid + ".back.safetensors")
            cairn(daemon, "get", mid, "-o", str(out))
            assert out.read_bytes() == (work / (mid + ".safetensors")).read_bytes()
        assert best[g] == max(scores, key=scores.get)
    # Each candidate trained one of the two layers: the other is its parent's, stored once.
    for c in range(C):
        mine = load_file(str(work / ("sw-g1-c%d.safetensors" % c)))
        base_t = load_file(str(base))
        layer = "l%d" % ((1000 + c) % 2)
        other = "l%d" % (1 - (1000 + c) % 2)
        assert (mine[other + ".weight"] == base_t[other + ".weight"]).all()
        assert not (mine[layer + ".weight"] == base_t[layer + ".weight"]).all()
    print("nas.swift: %d generations x %d candidates on 3 ranks in %.1f s" % (G, C, secs))


def test_a_blob_put_in_one_leaf_is_read_in_another(swift, daemon, tmp_path):
    script = tmp_path / "blobs.swift"
    script.write_text(open(os.path.join(SOURCE, "tests", "system", "swift", "blobs.swift")).read())
    p, _ = run_swift(swift, str(script), [], daemon["socket"], str(tmp_path))
    assert p.returncode == 0, p.stdout
    assert "put 24 bytes" in p.stdout and "got 1.5 2.5 3.0" in p.stdout and "poll=1" in p.stdout, p.stdout


def test_without_a_daemon_the_workflow_fails_at_once_naming_the_socket(swift, tmp_path):
    script = tmp_path / "blobs.swift"
    script.write_text(open(os.path.join(SOURCE, "tests", "system", "swift", "blobs.swift")).read())
    missing = str(tmp_path / "no-daemon" / "cairnd.sock")
    p, secs = run_swift(swift, str(script), [], missing, str(tmp_path), timeout=120)
    assert p.returncode != 0, p.stdout
    assert missing in p.stdout, p.stdout
    assert secs < 60, "took %.1f s to fail" % secs
