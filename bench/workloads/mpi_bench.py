"""Data-parallel checkpoints with MPI ranks (docs/mpi.md): a GPT-2-small-sized state dict (124 M
parameters, F32, 498 MB) held by every rank, saved with cairn.torch.save_sharded (each rank commits
its share as one part; the call returns once the share is in the daemon's arena) against the usual
way, torch.save from rank 0 while the others wait at a barrier; and restored with load_sharded (each
share read once and broadcast) against torch.load of the file on every rank. Blocking time = until
the slowest rank can go on. The first repeat (a new connection) apart, medians of the others; 1, 2 and 4 ranks (mpirun --oversubscribe here).

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
           "torch_load_s": []}

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
    ap.add_argument("--dir")
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    from bench_daemon import Daemon
    if a.quick:
        a.layers, a.vocab, a.repeats = 1, 2048, 2
    results = []
    with tempfile.TemporaryDirectory(prefix="cairn-bench-mpi-") as tmp:
        d = Daemon(BUILD, Path(tmp), "3GiB").start()
        try:
            env = dict(os.environ, CAIRN_SOCKET=d.socket, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                       OMPI_MCA_rmaps_base_oversubscribe="1")
            for n in [int(x) for x in a.ranks.split(",")]:
                part = os.path.join(tmp, "r%d.json" % n)
                subprocess.run(["mpirun", "-np", str(n), sys.executable, __file__, "--worker", "--dir", tmp, "--json", part,
                                "--layers", str(a.layers), "--vocab", str(a.vocab), "--repeats", str(a.repeats)],
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
            print("%d ranks, %s: cairn blocks %.1f ms (local after %.1f ms) vs torch.save %.1f ms; restore %.1f ms "
                  "vs torch.load %.1f ms" % (r["ranks"], which, r["cairn_block_s_" + which] * 1e3,
                                             r["cairn_local_s_" + which] * 1e3, r["torch_save_block_s_" + which] * 1e3,
                                             r["cairn_restore_s_" + which] * 1e3, r["torch_load_s_" + which] * 1e3))


if __name__ == "__main__":
    main()
