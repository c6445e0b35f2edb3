"""The DeepHyper example (workflow/examples/deephyper_nas.py) as a user runs it: a real
regularized-evolution search from PyPI's deephyper, 4 worker processes on CPU, against a real cairnd.

Checks that the search completed with DeepHyper's results (results.csv, one DONE row per
evaluation), that every evaluated candidate except the first (the seed) is stored with a parent,
the ancestor cairn named, with its score in the model metadata, and that the stored lineage is the
one the run function reported.
"""
import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("deephyper", reason="deephyper is not installed (pip install -r requirements.txt)")

import cairn  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "workflow" / "examples" / "deephyper_nas.py"
EVALS, WORKERS = 10, 4


def test_deephyper_search_stores_every_candidate_with_its_ancestor(daemon, tmp_path):
    prefix = "deephyper-test/"
    log_dir = tmp_path / "log"
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--evals", str(EVALS), "--workers", str(WORKERS),
         "--socket", daemon.socket, "--prefix", prefix, "--log-dir", str(log_dir)],
        env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=80)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    with open(log_dir / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == EVALS, proc.stdout
    assert all(r["job_status"] == "DONE" for r in rows), rows

    c = cairn.connect(daemon.socket)
    try:
        seed = c.show(f"{prefix}cseed")
        assert not seed.get("parent"), seed
        assert 0.0 <= seed["metadata"]["score"] <= 1.0
        ids = {f"{prefix}cseed"}
        for r in rows:
            model = r["m:model"]
            info = c.show(model)
            assert r["m:parent"], f"{model} has no ancestor:\n{proc.stdout}"
            assert info["parent"] == r["m:parent"], (model, info["parent"], r["m:parent"])
            assert info["metadata"]["score"] == pytest.approx(float(r["objective"]))
            assert info["metadata"]["search"] == prefix
            assert r["m:transferred"], f"{model} took no layer from {r['m:parent']}"
            assert c.lineage(model)["ancestors"][-1] == f"{prefix}cseed"
            ids.add(model)
        assert len(ids) == EVALS + 1
        stored = {m["id"] for m in c.list() if m["id"].startswith(prefix)}
        assert stored == ids
    finally:
        c.close()
    assert "DeepHyper results:" in proc.stdout
