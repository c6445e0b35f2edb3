"""MPI checkpoints as multi-part models (include/cairn/cairn_mpi.h, workflow/examples/mpi_checkpoint.c)
with Debian's Open MPI against a real cairnd: `mpirun -np 4` stores one model whose tensors came
from 4 ranks, each rank restores it exactly, and `cairn get` reads it back; 1 and 2 ranks too.
As root, Open MPI needs OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 (docs/mpi.md)."""
import json
import os
import shutil
import subprocess

import pytest
from safetensors.numpy import load_file

from daemons import cairnd

SOURCE = os.environ.get("CAIRN_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
BUILD = os.environ.get("CAIRN_BUILD_DIR", os.path.join(SOURCE, "build"))
EXAMPLE = os.path.join(BUILD, "bin", "mpi_checkpoint")


@pytest.fixture(scope="module")
def daemon():
    if not os.path.exists(EXAMPLE):
        pytest.skip("built without MPI (CAIRN_WITH_MPI=OFF): %s is missing" % EXAMPLE)
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun is not installed (Debian: openmpi-bin)")
    with cairnd(BUILD, "cairn-mpi-", dram="512MiB") as d:
        d["env"] = dict(os.environ, CAIRN_SOCKET=d["socket"], OMPI_ALLOW_RUN_AS_ROOT="1",
                        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
        yield d

def mpirun(daemon, n, *args):
    p = subprocess.run(["mpirun", "-np", str(n), EXAMPLE] + list(args), env=daemon["env"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True, timeout=300)
    assert p.returncode == 0, p.stdout
    return p.stdout


def cairn(daemon, *args):
    p = subprocess.run([os.path.join(BUILD, "bin", "cairn")] + list(args), env=daemon["env"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True)
    assert p.returncode == 0, p.stdout
    return p.stdout


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_checkpoint_from_ranks_restores_exactly(daemon, ranks):
    out = mpirun(daemon, ranks, "--id", "ck%d" % ranks, "--mib", "16")
    assert "%d ranks" % ranks in out and "restore exact on every rank" in out, out
    show = json.loads(cairn(daemon, "show", "ck%d" % ranks))
    assert [t["name"] for t in show["tensors"]] != [] and len(show["tensors"]) == 12
    print(out.strip())


@pytest.mark.parametrize("ranks,per_node", [(4, 2), (3, 2)])
def test_restore_across_nodes_reads_each_share_once_and_broadcasts_it(daemon, ranks, per_node):
    # CAIRN_MPI_NODE groups ranks as if they were on different nodes (each group reads its share
    # from "its" daemon and receives the others' by broadcast); 3 ranks in groups of 2 and 1 take the
    # path for nodes with different rank counts.
    wrapper = "CAIRN_MPI_NODE=$((OMPI_COMM_WORLD_RANK / %d)) exec \"$0\" \"$@\"" % per_node
    p = subprocess.run(["mpirun", "-np", str(ranks), "sh", "-c", wrapper, EXAMPLE, "--id", "cross%d" % ranks,
                        "--mib", "16"], env=daemon["env"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True, timeout=300)
    assert p.returncode == 0, p.stdout
    assert "%d ranks" % ranks in p.stdout and "restore exact on every rank" in p.stdout, p.stdout


def test_a_rank_that_never_commits_fails_every_other_ranks_ticket_and_leaves_nothing(daemon):
    p = subprocess.run(["mpirun", "-np", "4", EXAMPLE, "--id", "ck-stall", "--mib", "8", "--stall-rank", "2",
                        "--timeout-ms", "1500"], env=daemon["env"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True, timeout=300)
    assert p.returncode != 0, p.stdout
    failed = [line for line in p.stdout.splitlines() if "the checkpoint failed" in line]
    assert sorted(line.split(":")[0] for line in failed) == ["rank 0", "rank 1", "rank 3"], p.stdout
    assert all("part 2 of 4" in line for line in failed), p.stdout
    q = subprocess.run([os.path.join(BUILD, "bin", "cairn"), "show", "ck-stall"], env=daemon["env"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    assert q.returncode != 0 and "ck-stall" in q.stdout, q.stdout
    # The id was not taken: the same checkpoint by every rank succeeds.
    assert "restore exact on every rank" in mpirun(daemon, 4, "--id", "ck-stall", "--mib", "8")


def test_four_rank_checkpoint_reads_back_with_cairn_get_and_derives_from_its_parent(daemon, tmp_path):
    mpirun(daemon, 4, "--id", "ck-a", "--mib", "16")
    mpirun(daemon, 4, "--id", "ck-b", "--mib", "16", "--parent", "ck-a", "--durability", "global")
    show = json.loads(cairn(daemon, "show", "ck-b"))
    assert show["parent"] == "ck-a"
    a = tmp_path / "a.safetensors"
    b = tmp_path / "b.safetensors"
    cairn(daemon, "get", "ck-a", "-o", str(a))
    cairn(daemon, "get", "ck-b", "-o", str(b))
    ta, tb = load_file(str(a)), load_file(str(b))
    assert sorted(ta) == sorted(tb) and len(ta) == 12
    for k in ta:
        assert (ta[k] == tb[k]).all()


def test_torch_save_sharded_and_load_sharded_over_mpi4py(daemon):
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        pytest.skip("mpi4py is not installed (Debian: python3-mpi4py)")
    import sys
    script = os.path.join(SOURCE, "workflow", "examples", "torch_sharded.py")
    env = dict(daemon["env"], PYTHONPATH=os.path.join(SOURCE, "api", "python"))
    env.setdefault("CAIRN_LIBRARY", os.path.join(BUILD, "lib", "libcairn.so"))
    p = subprocess.run(["mpirun", "-np", "3", sys.executable, script, "--id", "ts", "--width", "256"], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=300)
    assert p.returncode == 0, p.stdout
    assert "3 ranks" in p.stdout and "exact on every rank" in p.stdout, p.stdout
    # As if on two nodes (ranks 0,1 and 2,3): each node reads its share, the other's is broadcast.
    wrapper = "CAIRN_MPI_NODE=$((OMPI_COMM_WORLD_RANK / 2)) exec \"$0\" \"$@\""
    q = subprocess.run(["mpirun", "-np", "4", "sh", "-c", wrapper, sys.executable, script, "--id", "ts4", "--width", "256"],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=300)
    assert q.returncode == 0 and "4 ranks" in q.stdout and "exact on every rank" in q.stdout, q.stdout
    # Copied in the background while the ranks train a step; the optimizer's step waits for the copy.
    b = subprocess.run(["mpirun", "-np", "2", sys.executable, script, "--id", "ts-bg", "--width", "256", "--background"],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=300)
    assert b.returncode == 0 and "(background): 2 ranks" in b.stdout and "exact on every rank" in b.stdout, b.stdout
    show = json.loads(cairn(daemon, "show", "ts"))
    assert show["metadata"] == {"step": 1}
    assert {t["dtype"] for t in show["tensors"]} == {"F32", "BF16"}
    print(p.stdout.strip())
