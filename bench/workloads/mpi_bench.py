"""Data-parallel checkpoints with MPI ranks (docs/mpi.md): a GPT-2-small-sized state dict (124 M
parameters, F32, 498 MB) held by every rank, saved with cairn.torch.save_sharded (each rank commits
its share as one part; the call returns once the share is in the daemon's arena) against the usual
way, torch.save from rank 0 while the others wait at a barrier; and restored with load_sharded (each
share read once and broadcast) against torch.load of the file on every rank. Blocking time = until
the slowest rank can go on. Also the same checkpoint taken in the background
(save_sharded(background=True)) during a stand-in training step (--step-ms of single-threaded matrix
products): blocked = that step with the checkpoint, until wait_copied(), minus the step alone. The first repeat (a new connection) apart, medians of the others; 1, 2 and 4 ranks (mpirun --oversubscribe here).

Usage: mpi_bench.py [--quick] [--ranks 1,2,4] [--json FILE]     (runs mpirun itself)
       mpi_bench.py --worker ...                                 (one rank, under mpirun)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("CAIRN_BUILD_DIR", ROOT / "build"))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def gpt2_state(n_layer, vocab, d=768, ctx=1024):
    import torch
    g = torch.Generator().manual_seed(0)
    s = {"wte.weight": (vocab, d), "wpe.weight": (ctx, d)}
    for i in range(n_layer):
        p = "h.%d." % i
        s.update({p + "ln_1.weight": (d,), p + "ln_1.bias": (d,), p + "attn.c_attn.weight": (d, 3 * d),
                  p + "attn.c_attn.bias": (3 * d,), p + "attn.c_proj.weight": (d, d), p + "attn.c_proj.bias": (d,),
                  p + "ln_2.weight": (d,), p + "ln_2.bias": (d,), p + "mlp.c_fc.weight": (d, 4 * d),
                  p + "mlp.c_fc.bias": (4 * d,), p + "mlp.c_proj.weight": (4 * d, d), p + "mlp.c_proj.bias": (d,)})
    s.update({"ln_f.weight": (d,), "ln_f.bias": (d,)})
    return {k: torch.randn(shape, generator=g) * 0.02 for k, shape in s.items()}


def worker(a):
    import numpy as np
    import torch
    from mpi4py import MPI
    import cairn
    import cairn.torch
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    state = gpt2_state(a.layers, a.vocab)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    # Touch as much memory as the run will use once before measuring: on a VM the first touch of
    # a guest page also costs the hypervisor's backing it, which would be charged to whichever of
    # cairn and torch runs first. Both then pay the kernel's page clearing as on bare metal.
    warm = np.ones(2 * nbytes // 8, np.float64)
    del warm
    c = cairn.connect()
    path = os.path.join(a.dir, "ckpt-%d.pt" % size)
    out = {"ranks": size, "bytes": nbytes, "params": sum(t.numel() for t in state.values()),
           "cairn_block_s": [], "cairn_local_s": [], "torch_save_block_s": [], "cairn_restore_s": [],
           "torch_load_s": [], "cairn_background_block_s": [], "step_alone_s": [], "background_copy_s": []}

    # The training step a background checkpoint overlaps (the next forward and backward pass, which
    # only read the weights): single-threaded matrix products, as an accelerator's host thread keeps
    # one core busy, calibrated to about --step-ms on this rank.
    a_mat, b_mat = torch.randn(384, 384), torch.randn(384, 384)

    def matmuls(n):
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            for _ in range(n):
                torch.mm(a_mat, b_mat)
        finally:
            torch.set_num_threads(threads)

    t0 = time.perf_counter()
    matmuls(20)
    per = (time.perf_counter() - t0) / 20
    step_n = comm.allreduce(max(1, int(a.step_ms / 1e3 / per)), op=MPI.MAX)
    out["step_matmuls"] = step_n

    def timed(fn):
        comm.Barrier()
        t0 = time.perf_counter()
        r = fn()
        mine = time.perf_counter() - t0
        return comm.allreduce(mine, op=MPI.MAX), r

    def save_rank0():
        if rank == 0:
            torch.save(state, path)
        comm.Barrier()

    # Rep 0 is the first checkpoint and restore on a new connection (reported apart); cairn and
    # torch take turns going first.
    for rep in range(a.repeats):
        mid = "gpt2-%d-r%d-%d" % (size, rep, os.getpid() if rank == 0 else 0)
        mid = comm.bcast(mid, root=0)
        if rep % 2:
            t, _ = timed(save_rank0)
            out["torch_save_block_s"].append(t)
        blocked, ticket = timed(lambda: cairn.torch.save_sharded(state, mid, comm, client=c, durability="local",
                                                                 timeout=120))
        t0 = time.perf_counter()
        ticket.wait(timeout=600)
        local = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX) + blocked
        out["cairn_block_s"].append(blocked)
        out["cairn_local_s"].append(local)
        if rep % 2 == 0:
            t, _ = timed(save_rank0)
            out["torch_save_block_s"].append(t)

        # The same checkpoint taken in the background (save_sharded(background=True)), overlapped
        # with a training step; blocked = the step with the checkpoint, until the weights may change
        # (wait_copied), minus the step alone (the mean of one just before and one just after, as
        # the kernel's writeback of the files above drifts through the measurement), slowest rank.
        # A quiet node first: the daemon's flush of the checkpoints above to the repository and the
        # kernel's writeback of torch.save's file would land in one step and not the other.
        if rank == 0:
            c.flush(timeout=600)
            os.sync()
        alone_before, _ = timed(lambda: matmuls(step_n))

        def step_with_checkpoint():
            snap = cairn.torch.save_sharded(state, mid + "-bg", comm, client=c, durability="local", timeout=120,
                                            background=True)
            matmuls(step_n)
            snap.wait_copied()
            return snap
        with_ckpt, snap = timed(step_with_checkpoint)
        snap.wait(timeout=600)
        alone_after, _ = timed(lambda: matmuls(step_n))
        alone = (alone_before + alone_after) / 2  # the machine's background work (writeback) drifts
        out["step_alone_s"].append(alone)
        out["cairn_background_block_s"].append(max(0.0, with_ckpt - alone))
        out["background_copy_s"].append(comm.allreduce(snap.copy_seconds, op=MPI.MAX))

        restores = [("cairn_restore_s", lambda: cairn.torch.load_sharded(mid, comm, client=c)),
                    ("torch_load_s", lambda: torch.load(path))]
        for name, fn in (restores[::-1] if rep % 2 else restores):
            t, got = timed(fn)
            out[name].append(t)
            assert all(torch.equal(got[k], state[k]) for k in state), name + ": the restored state differs"
            del got
    if rank == 0:
        Path(a.json).write_text(json.dumps(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--step-ms", type=float, default=300.0)
    ap.add_argument("--dir")
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    from bench_daemon import Daemon
    if a.quick:
        a.layers, a.vocab, a.repeats, a.step_ms = 1, 2048, 2, 20.0
    results = []
    with tempfile.TemporaryDirectory(prefix="cairn-bench-mpi-") as tmp:
        d = Daemon(BUILD, Path(tmp), "5GiB").start()
        try:
            env = dict(os.environ, CAIRN_SOCKET=d.socket, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                       OMPI_MCA_rmaps_base_oversubscribe="1",  # Open MPI 4 (Debian)
                       PRTE_MCA_rmaps_default_mapping_policy=":oversubscribe")  # Open MPI 5 (PRRTE)
            for n in [int(x) for x in a.ranks.split(",")]:
                part = os.path.join(tmp, "r%d.json" % n)
                subprocess.run(["mpirun", "-np", str(n), sys.executable, __file__, "--worker", "--dir", tmp, "--json", part,
                                "--layers", str(a.layers), "--vocab", str(a.vocab), "--repeats", str(a.repeats),
                                "--step-ms", str(a.step_ms)],
                               env=env, check=True, timeout=1800)
                r = json.loads(Path(part).read_text())
                for k in list(r):
                    if k.endswith("_s"):
                        r[k + "_first"] = r[k][0]
                        r[k + "_median"] = statistics.median(r[k][1:] or r[k])
                results.append(r)
        finally:
            d.stop()
    Path(a.json).write_text(json.dumps({"runs": results, "cores": os.cpu_count()}, indent=1))
    for r in results:
        for which in ("first", "median"):
            print("%d ranks, %s: cairn blocks %.1f ms (local after %.1f ms; in the background %.1f ms, a step of %.0f ms) "
                  "vs torch.save %.1f ms; restore %.1f ms vs torch.load %.1f ms"
                  % (r["ranks"], which, r["cairn_block_s_" + which] * 1e3, r["cairn_local_s_" + which] * 1e3,
                     r["cairn_background_block_s_" + which] * 1e3, r["step_alone_s_" + which] * 1e3,
                     r["torch_save_block_s_" + which] * 1e3, r["cairn_restore_s_" + which] * 1e3,
                     r["torch_load_s_" + which] * 1e3))


if __name__ == "__main__":
    main()
