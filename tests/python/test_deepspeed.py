"""cairn.deepspeed against DeepSpeed itself: a 2-rank engine (gloo, DeepSpeed's CPU accelerator, ZeRO
stage 1, DeepSpeed's torch Adam) trains a small transformer with a frozen embedding, saves at two
tags through CairnCheckpointEngine, and a restarted pair of ranks loads the later tag ("latest").

- The restarted engine's module and optimizer state equal what was saved, tensor for tensor.
- Each tag is one cairn model of one part per rank, derived from the previous tag; the second tag
  adds fewer repository bytes than the first (the frozen embedding is stored once).
- An unreachable daemon: cairn.Unavailable naming the socket and the checkpoint.

The ranks are processes of this file (``python test_deepspeed.py <phase> ...``), started by pid with
a timeout. Skipped when DeepSpeed cannot be imported or cannot initialize on the CPU here.
"""
import importlib.util
import json
import os
import socket as _socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if __name__ != "__main__" and importlib.util.find_spec("deepspeed") is None:
    pytest.skip("DeepSpeed is not installed (requirements.txt pins it)", allow_module_level=True)

HERE = Path(__file__).resolve()
ROOT = HERE.parents[2]
WORKER_TIMEOUT = 150


# ---- the ranks ----

def _model():
    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(4096, 64)  # 1 MiB, frozen: stored by the first tag only
            self.embed.weight.requires_grad_(False)
            self.block = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
            self.head = torch.nn.Linear(64, 16)

        def forward(self, x):
            return self.head(self.block(self.embed(x)).mean(dim=1))
    return Tiny()


def _engine(seed):
    import deepspeed
    torch.manual_seed(seed)
    model = _model()
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
        "zero_optimization": {"stage": 1},
        "steps_per_print": 1000,
    }
    engine, *_ = deepspeed.initialize(model=model, config=config,
                                      model_parameters=[p for p in model.parameters() if p.requires_grad])
    return engine


def _train(engine, steps, seed):
    g = torch.Generator().manual_seed(seed + engine.global_rank)
    for _ in range(steps):
        x = torch.randint(0, 4096, (4, 8), generator=g)
        y = torch.randint(0, 16, (4,), generator=g)
        loss = torch.nn.functional.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()


def _snapshot(engine):
    return {"module": {k: v.detach().clone() for k, v in engine.module.state_dict().items()},
            "optimizer": engine.optimizer.state_dict(), "global_steps": engine.global_steps}


def _worker(phase, sock, ckpt_dir, out):
    sys.path.insert(0, str(ROOT / "api" / "python"))
    import deepspeed
    import torch.distributed as dist

    import cairn
    import cairn.deepspeed

    # DeepSpeed's CPU accelerator JIT-compiles a shared-memory all-reduce at init (ops are off in the
    # PyPI build): a C++ build of a minute or more; gloo does the collectives without it.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    report = {}
    if phase == "save":
        engine = _engine(seed=1)
        ce = cairn.deepspeed.install(engine, socket=sock, durability="global")
        c = cairn.connect(sock)
        for i, tag in enumerate(("t1", "t2")):
            _train(engine, 3, seed=10 * i)
            dist.barrier()
            before = c.stats()["repository"]["physical_bytes"]
            engine.save_checkpoint(ckpt_dir, tag=tag)
            report[tag] = {"stored": c.stats()["repository"]["physical_bytes"] - before, "model": ce.last_model}
            dist.barrier()
        torch.save(_snapshot(engine), os.path.join(out, f"saved-{rank}.pt"))
    else:
        engine = _engine(seed=2)  # other initial weights: the load must replace them all
        ce = cairn.deepspeed.install(engine, socket=sock)
        path, _ = engine.load_checkpoint(ckpt_dir)
        report["loaded"] = {"path": path, "model": ce.last_model}
        torch.save(_snapshot(engine), os.path.join(out, f"loaded-{rank}.pt"))
    with open(os.path.join(out, f"{phase}-{rank}.json"), "w") as f:
        json.dump(report, f)
    dist.barrier()
    dist.destroy_process_group()


def _free_port():
    with _socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ranks(phase, sock, ckpt_dir, out, world=2):
    port = _free_port()
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), DS_ACCELERATOR="cpu", OMP_NUM_THREADS="2",
                   CUDA_VISIBLE_DEVICES="")
        log = open(os.path.join(out, f"{phase}-{r}.log"), "w")
        procs.append((subprocess.Popen([sys.executable, str(HERE), phase, str(sock), str(ckpt_dir), str(out)],
                                       env=env, stdout=log, stderr=subprocess.STDOUT), log))
    try:
        for p, _ in procs:
            p.wait(timeout=WORKER_TIMEOUT)
    finally:
        for p, log in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            log.close()
    logs = "\n".join(Path(out, f"{phase}-{r}.log").read_text()[-3000:] for r in range(world))
    return [p.returncode for p, _ in procs], logs


def _assert_same(a, b, where="state"):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert set(a) == set(b), (where, set(a) ^ set(b))
        for k in a:
            _assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}.{i}")
    elif type(a).__eq__ is object.__eq__ and hasattr(a, "__dict__"):  # e.g. DeepSpeed's loss scaler
        assert type(a) is type(b), where
        _assert_same(vars(a), vars(b), where)
    else:
        assert a == b, (where, a, b)


# ---- the tests ----

def test_two_ranks_save_two_tags_and_resume(daemon, client, tmp_path):
    ckpt_dir, out = tmp_path / "ckpt", tmp_path / "out"
    out.mkdir()
    rcs, logs = _run_ranks("save", daemon.socket, ckpt_dir, out)
    if any(rcs) and not (out / "save-0.json").exists() and "init_distributed" in logs:
        pytest.skip(f"DeepSpeed cannot initialize gloo on the CPU here:\n{logs[-1500:]}")
    assert rcs == [0, 0], logs
    rep = json.loads((out / "save-0.json").read_text())
    t1, t2 = rep["t1"], rep["t2"]
    assert t1["model"] == f"deepspeed:{ckpt_dir}/t1" and t2["model"] == f"deepspeed:{ckpt_dir}/t2"
    assert json.loads((out / "save-1.json").read_text())["t2"]["model"] == t2["model"]

    # One model per tag, every rank's files in it, derived from the previous tag.
    shown = client.show(t2["model"])
    assert shown.get("parent") == t1["model"], shown
    assert shown["metadata"]["cairn.deepspeed"]["ranks"] == 2
    with client.model_open(t2["model"]) as r:
        files = {t[0].split("/")[0] for t in r.tensors}
    assert files == {"mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
                     "zero_pp_rank_1_mp_rank_00_optim_states.pt"}, files
    assert (ckpt_dir / "latest").read_text() == "t2"
    for f in files:  # pointer files where DeepSpeed looks for its files
        assert json.loads((ckpt_dir / "t2" / f).read_text())["cairn.deepspeed"]["model"] == t2["model"]

    # The second tag stores fewer new bytes: the frozen embedding (1 MiB) is not stored again.
    assert t1["stored"] >= 4096 * 64 * 4, rep
    assert t2["stored"] < t1["stored"] - 4096 * 64 * 4 * 0.9, rep
    print(f"\ncairn.deepspeed bytes stored: t1 {t1['stored']} B, t2 {t2['stored']} B")

    rcs, logs = _run_ranks("load", daemon.socket, ckpt_dir, out)
    assert rcs == [0, 0], logs
    for r in range(2):
        loaded = json.loads((out / f"load-{r}.json").read_text())["loaded"]
        assert loaded["model"] == t2["model"] and loaded["path"], loaded
        saved = torch.load(out / f"saved-{r}.pt", weights_only=False)
        got = torch.load(out / f"loaded-{r}.pt", weights_only=False)
        _assert_same(saved, got, f"rank {r}")


def test_unreachable_daemon(tmp_path):
    sys.path.insert(0, str(ROOT / "api" / "python"))
    import cairn
    from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointCommitInfo

    from cairn.deepspeed import CairnCheckpointEngine

    sock = tmp_path / "nobody" / "cairnd.sock"
    ce = CairnCheckpointEngine(socket=sock)
    with pytest.raises(cairn.Unavailable) as e:
        ce.create(CheckpointCommitInfo(tag="t1", save_dir=str(tmp_path), save_latest=True))
    assert str(sock) in str(e.value) and "'t1'" in str(e.value), str(e.value)

    # A pointer file whose daemon is gone: the same one-line error, naming the file.
    path = tmp_path / "t1" / "mp_rank_00_model_states.pt"
    path.parent.mkdir()
    path.write_text('{"cairn.deepspeed": {"format": 1, "model": "deepspeed:x/t1", "file": "a.pt"}}\n')
    with pytest.raises(cairn.Unavailable) as e:
        ce.load(str(path), map_location="cpu")
    assert str(sock) in str(e.value) and str(path) in str(e.value), str(e.value)


if __name__ == "__main__":
    _worker(*sys.argv[1:5])
