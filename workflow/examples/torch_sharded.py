"""Data-parallel checkpoint of a PyTorch model with cairn.torch.save_sharded / load_sharded over
mpi4py (docs/mpi.md): every rank holds the same replica; each commits only its share; every rank
restores the whole state, read once and broadcast.

    mpirun -np 4 python3 torch_sharded.py --id ckpt [--width 512] [--parent ID] [--background]

--background: the checkpoint is copied in the background (save_sharded(background=True)) while the
ranks run a training step, whose optimizer step waits for the copy (optimizer=); the restored state
is the one from before that step.
"""
import argparse
import time

import torch
from mpi4py import MPI

import cairn
import cairn.torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--id", default="torch-sharded")
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--parent")
    ap.add_argument("--durability", default="local")
    ap.add_argument("--background", action="store_true")
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    torch.manual_seed(0)  # the same replica on every rank
    model = torch.nn.Sequential(torch.nn.Linear(a.width, a.width), torch.nn.ReLU(),
                                torch.nn.Linear(a.width, a.width).to(torch.bfloat16), torch.nn.LayerNorm(a.width))
    ref = {k: v.clone() for k, v in model.state_dict().items()}  # what the checkpoint must hold
    comm.Barrier()
    t0 = time.perf_counter()
    if a.background:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ticket = cairn.torch.save_sharded(model, a.id, comm, parent=a.parent, meta={"step": 1},
                                          durability=a.durability, timeout=30, background=True, optimizer=opt)
        blocked = time.perf_counter() - t0
        model[0](torch.randn(8, a.width)).sum().backward()  # a training step (of the F32 layer): reads the weights
        opt.step()  # waits for the copy, then changes the weights
        if torch.equal(model.state_dict()["0.weight"], ref["0.weight"]):
            raise SystemExit("the training step changed nothing")
    else:
        ticket = cairn.torch.save_sharded(model, a.id, comm, parent=a.parent, meta={"step": 1},
                                          durability=a.durability, timeout=30)
        blocked = time.perf_counter() - t0
    ticket.wait(timeout=120)
    comm.Barrier()
    t0 = time.perf_counter()
    state = cairn.torch.load_sharded(a.id, comm)
    restored = time.perf_counter() - t0
    # The model's tensors are in part order; the state dict's keys are all there, exact.
    exact = sorted(state) == sorted(ref) and all(
        state[k].dtype == ref[k].dtype and torch.equal(state[k], ref[k]) for k in ref)
    if not exact:
        print("rank %d: differs: %s" % (comm.Get_rank(), [k for k in ref if k not in state or state[k].dtype != ref[k].dtype
                                                          or not torch.equal(state[k], ref[k])]), flush=True)
    all_exact = comm.allreduce(1 if exact else 0, op=MPI.MIN)
    blocked_max = comm.reduce(blocked, op=MPI.MAX, root=0)
    restored_max = comm.reduce(restored, op=MPI.MAX, root=0)
    if comm.Get_rank() == 0:
        print("save_sharded %s%s: %d ranks, blocked %.1f ms, restore %.1f ms, %s" % (
            a.id, " (background)" if a.background else "", comm.Get_size(), blocked_max * 1e3, restored_max * 1e3,
            "exact on every rank" if all_exact else "DIFFERS"))
    raise SystemExit(0 if all_exact else 1)


if __name__ == "__main__":
    main()
