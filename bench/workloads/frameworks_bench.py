#!/usr/bin/env python3
"""The framework doors (docs/frameworks.md) beside each framework's own default, in the same run, on
the same machine and filesystem: DeepSpeed, Lightning, Hugging Face transformers, and a DeepHyper-style
architecture search that transfers weights from the best stored ancestor.

Each sub-part starts a cairnd of its own (its own repository under a temporary directory; arena
backed before the first measurement; stopped by pid) and measures:

- ``deepspeed``: a GPT-2-small-sized model (transformers' ``GPT2LMHeadModel`` built from the default
  ``GPT2Config``: 124 M parameters) trained with DeepSpeed's torch Adam under ZeRO stage 1 on 2 gloo
  ranks (DeepSpeed's CPU accelerator). ``engine.save_checkpoint`` with DeepSpeed's default engine
  (``TorchCheckpointEngine``: torch.save of each file) and with ``CairnCheckpointEngine`` (durability
  ``memory``: it returns once the checkpoint is in the daemon's memory), taking turns going first,
  after a training step each time: the time the ranks block (until the slowest returns), median of
  ``--repeats``. After each save the kernel's writeback (``sync``) and the daemon's flush to its
  repository finish, outside the timings. Beside it, ``decoupled=True``: ``save_checkpoint`` returns
  once the bytes are in the arena and DeepSpeed commits at the next optimizer step; that step's time
  beyond a plain step is added. Then one more cairn save, a training step, and ``load_checkpoint`` of
  that tag: the module and optimizer state must equal what was saved.
- ``lightning``: a ``Trainer.fit`` of ``--epochs`` (20) epochs of a model whose body (24 linear layers,
  1024 x 1024: 100 MB) is frozen under a trainable head (Adam), ``ModelCheckpoint`` saving at every
  epoch and keeping all (``save_top_k=-1``): once with Lightning's default ``TorchCheckpointIO`` and
  once with ``CairnCheckpointIO(durability="memory")`` (and, in a full run, once more at its default
  ``global``). Bytes: what the checkpoint directory holds after the fit (TorchCheckpointIO's files;
  the plugin's pointer files) plus, for cairn, what the repository directory grew by once the daemon
  flushed (packs, manifests, catalog). Time: the sum over the fit of the time spent in the plugin's
  ``save_checkpoint``. The last checkpoint is loaded back and compared with the fitted module.
- ``transformers``: a BERT-base-sized ``BertModel`` (transformers' default ``BertConfig``: 110 M
  parameters, 438 MB) with random weights, written with ``save_pretrained`` to a local directory
  (safetensors) and stored with ``cairn.transformers.save_pretrained``. Warm: ``BertModel.from_pretrained
  (dir)`` with the directory in the page cache, against ``cairn.transformers.from_pretrained(BertModel,
  id)`` with the model in the daemon's memory, taking turns, median of ``--repeats`` after a first load
  of each. Cold: one load each after dropping the page cache (as root ``drop_caches``, else
  ``posix_fadvise(DONTNEED)`` on the files; the row says which), cairn's from a daemon restarted on its
  repository. Every load is compared with the model's weights.
- ``nas``: ``--candidates`` (24) candidates of a regularized-evolution search (population 8, sample
  3, one hyperparameter mutated per child; seeded) over MLPs: a fixed stem ``Linear(512, 1024)``, 1 to
  4 hidden layers of width 512 to 2048, a linear head (up to 48 MB of float32 per model). Each
  candidate's time to first batch (from building the module to the end of its first training step)
  three ways, taking turns: cairn (``cairn.torch.transfer``: the best stored ancestor from the
  daemon's index and its matching layers, with a ``will_load`` hint, as
  ``workflow/examples/deephyper_nas.py`` does), and one file per model: ``torch.load`` of the
  ancestor's file and safetensors ``safe_open`` of the ancestor's file reading only the matching
  tensors (both told the ancestor and the layers cairn found: an index they do not have is given to
  them for free). Transferred layers are frozen, the rest trained a few steps; the candidate is saved
  with ``cairn.torch.save(parent=...)`` and as one torch.save and one safetensors file. Bytes: the
  repository directory's growth against the files. The three ways' transferred tensors must be
  equal, and cairn's ancestor must share the longest prefix any stored candidate shares.

A mismatch exits 1. Sizes with ``--quick``: GPT-2 with 2 layers of width 128, 3 epochs of a 1 MB
body, a 4.4 MB BERT, 6 candidates of widths 16 to 64; one repeat (its timings mean nothing).
The JSON's ``rows`` (name, value, baseline, baseline_value, unit, ratio = cairn / baseline, goal,
met, note) are what ``bench/run`` (part ``frameworks``) reads.

Usage: frameworks_bench.py [--quick] [--only deepspeed,lightning,transformers,nas] [--repeats N]
                           [--epochs N] [--candidates N] [--dir DIR] --json FILE
"""
import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("CAIRN_BUILD_DIR", ROOT / "build"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "api" / "python"))
os.environ.setdefault("CAIRN_LIBRARY", str(BUILD / "lib" / "libcairn.so"))

PARTS = ("deepspeed", "lightning", "transformers", "nas")
GOALS = {"deepspeed": "<= 0.1", "lightning_bytes": "<= 0.3", "lightning_time": "<= 0.2", "transformers": "<= 0.2"}


class Mismatch(SystemExit):
    """What was loaded differs from what was saved: the driver exits 1."""

    def __init__(self, what):
        super().__init__(f"frameworks_bench: {what}")
        self.code = 1


def tree_bytes(path):
    """The bytes of every file under path (0 when it does not exist)."""
    p = Path(path)
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.exists() else 0


def digests(obj, path=""):
    """(place, dtype, shape, sum of the 32-bit words) of every tensor reachable through dicts,
    lists and tuples, in order: equal states give equal lists."""
    import torch
    out = []
    if isinstance(obj, torch.Tensor):
        b = obj.detach().contiguous().reshape(-1).view(torch.uint8)
        words = b.view(torch.int32) if b.numel() % 4 == 0 else b
        out.append((path, str(obj.dtype), tuple(obj.shape), int(words.sum(dtype=torch.int64))))
    elif isinstance(obj, dict):
        for k in obj:
            out += digests(obj[k], f"{path}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out += digests(v, f"{path}.{i}")
    return out


def compare(name, got, want):
    if got != want:
        bad = [g[0] for g, w in zip(got, want) if g != w] or ["(a different number of tensors)"]
        raise Mismatch(f"{name}: what was loaded differs from what was saved in {len(bad)} tensors, e.g. {bad[:3]}")


def row(name, value, baseline, baseline_value, unit, goal=None, note=""):
    r = value / baseline_value if baseline_value else float("nan")
    met = None
    if goal:
        op, val = goal.split()
        met = r <= float(val) if op == "<=" else r >= float(val)
    return {"name": name, "value": value, "baseline": baseline, "baseline_value": baseline_value, "unit": unit,
            "ratio": r, "ratio_is": "cairn / baseline", "goal": goal, "met": met, "note": note}


def mib(nbytes):
    return f"{max(256, int(nbytes) >> 20)}MiB"


# ---- DeepSpeed: one rank ----

def ds_rank(a):
    warnings.simplefilter("ignore")
    import torch
    import torch.distributed as dist
    import deepspeed
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    import cairn
    import cairn.deepspeed as cds

    hf_logging.set_verbosity_error()
    # DeepSpeed's CPU accelerator builds a shared-memory all-reduce at init (ops are off in the PyPI
    # build): minutes of C++; gloo does the collectives without it (as tests/python/test_deepspeed.py).
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    torch.manual_seed(0)
    cfg = GPT2Config(**json.loads(a.gpt2))
    model = GPT2LMHeadModel(cfg)
    params = sum(p.numel() for p in model.parameters())
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "Adam", "params": {"lr": 1e-4, "torch_adam": True}},
              "zero_optimization": {"stage": 1}, "steps_per_print": 1 << 30}
    engine, *_ = deepspeed.initialize(model=model, config=config, model_parameters=model.parameters())
    g = torch.Generator().manual_seed(rank)
    work = Path(a.dir)

    def forward_backward():
        ids = torch.randint(0, cfg.vocab_size, (1, a.seq), generator=g)
        engine.backward(engine(ids, labels=ids).loss)

    def train_step():
        forward_backward()
        engine.step()

    def timed(fn):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        return dist_max(time.perf_counter() - t0)

    c = cairn.connect(a.socket)

    def settle():
        """The kernel's writeback and the daemon's flush to its repository, outside the timings."""
        os.sync()
        if rank == 0:
            c.flush(timeout=1800)
        dist.barrier()

    default = engine.checkpoint_engine
    memory = cds.CairnCheckpointEngine(getattr(engine, "_config", None), socket=a.socket, durability="memory")
    decoupled = cds.CairnCheckpointEngine(getattr(engine, "_config", None), socket=a.socket, durability="memory",
                                          decoupled=True)
    out = {"ranks": world, "params": params, "default_engine": type(default).__name__, "torch_s": [], "cairn_s": [],
           "decoupled_save_s": [], "decoupled_commit_step_s": [], "plain_step_s": [], "checkpoint_bytes": 0}
    train_step()  # Adam's state exists from here on
    for rep in range(a.repeats):
        train_step()
        runs = [("torch_s", default, work / "torch"), ("cairn_s", memory, work / "cairn")]
        for key, ce, d in (runs[::-1] if rep % 2 else runs):
            engine.checkpoint_engine = ce
            out[key].append(timed(lambda: engine.save_checkpoint(str(d), tag=f"r{rep}")))
            settle()
            if ce is default and rank == 0:
                out["checkpoint_bytes"] = tree_bytes(d / f"r{rep}")
                shutil.rmtree(d / f"r{rep}", ignore_errors=True)
            dist.barrier()
        # decoupled: save_checkpoint returns with the bytes in the arena; the next step commits.
        forward_backward()
        engine.checkpoint_engine = decoupled
        out["decoupled_save_s"].append(timed(lambda: engine.save_checkpoint(str(work / "cairn"), tag=f"d{rep}")))
        out["decoupled_commit_step_s"].append(timed(engine.step))
        forward_backward()
        out["plain_step_s"].append(timed(engine.step))
        settle()

    # The state saved last comes back equal after a training step changed it.
    engine.checkpoint_engine = memory
    engine.save_checkpoint(str(work / "cairn"), tag="verify")
    want = digests({"module": engine.module.state_dict(), "optimizer": engine.optimizer.state_dict()})
    train_step()
    engine.load_checkpoint(str(work / "cairn"), tag="verify")
    got = digests({"module": engine.module.state_dict(), "optimizer": engine.optimizer.state_dict()})
    compare(f"DeepSpeed rank {rank}: load_checkpoint of tag 'verify'", got, want)
    out["verified_tensors"] = len(want)
    c.close()
    dist.barrier()
    if rank == 0:
        Path(a.json).write_text(json.dumps(out))
    dist.destroy_process_group()


def dist_max(x):
    import torch
    import torch.distributed as dist
    t = torch.tensor([float(x)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def run_deepspeed(a, tmp):
    """Two DeepSpeed ranks (processes of this script) against a cairnd of their own."""
    import socket
    from bench_daemon import Daemon

    gpt2 = (dict(n_layer=2, n_embd=128, n_head=2, vocab_size=2048, n_positions=128) if a.quick
            else dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024))
    params = 12 * gpt2["n_layer"] * gpt2["n_embd"] ** 2 + (gpt2["vocab_size"] + gpt2["n_positions"]) * gpt2["n_embd"]
    d = Daemon(BUILD, tmp, mib(6 * 4 * params)).start()  # a checkpoint (weights, fp32 partition, Adam) and slack
    world = 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    report = tmp / "deepspeed.json"
    procs, logs = [], []
    try:
        for rank in range(world):
            env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                       LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       DS_ACCELERATOR="cpu", CUDA_VISIBLE_DEVICES="", GLOO_SOCKET_IFNAME="lo",
                       OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // world)))
            log = open(tmp / f"deepspeed-{rank}.log", "w")
            logs.append(log)
            procs.append(subprocess.Popen([sys.executable, __file__, "--role", "ds-rank", "--dir", str(tmp),
                                           "--socket", d.socket, "--gpt2", json.dumps(gpt2),
                                           "--seq", str(16 if a.quick else 64), "--repeats", str(a.repeats),
                                           "--json", str(report)], env=env, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 1800
        while any(p.poll() is None for p in procs):
            if any(p.returncode for p in procs) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        bad = [p.returncode for p in procs if p.returncode]
        if bad or any(p.poll() is None for p in procs):
            for log in logs:
                log.flush()
            tail = "\n".join((tmp / f"deepspeed-{r}.log").read_text()[-2000:] for r in range(world))
            print(tail, file=sys.stderr)
            code = bad[0] if bad else "no exit within 30 minutes"
            raise SystemExit(1 if code == 1 else f"frameworks_bench: a DeepSpeed rank failed ({code})")
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
        for log in logs:
            log.close()
        d.stop()
    r = json.loads(report.read_text())
    r["gpt2"] = gpt2
    return r


def deepspeed_rows(r):
    med = {k: statistics.median(v) for k, v in r.items() if k.endswith("_s") and isinstance(v, list) and v}
    n = r["repeats"] = len(r["torch_s"])
    size = (f"{'GPT-2-small-sized' if r['gpt2']['n_layer'] == 12 else 'small GPT-2'} model "
            f"({r['params'] / 1e6:.0f} M parameters) with Adam, ZeRO stage 1, {r['ranks']} gloo ranks, "
            f"{r['checkpoint_bytes'] / 1e9:.2f} GB per checkpoint")
    base = f"DeepSpeed's default engine ({r['default_engine']}: torch.save)"
    extra = max(0.0, med["decoupled_commit_step_s"] - med["plain_step_s"])
    return [
        row(f"DeepSpeed save_checkpoint, {size}: time the ranks block, CairnCheckpointEngine(durability='memory'), "
            f"median of {n}", med["cairn_s"], base, med["torch_s"], "s", GOALS["deepspeed"],
            "returns once the checkpoint is in the daemon's memory; writeback and the daemon's flush outside"),
        row(f"DeepSpeed save_checkpoint, {size}: time the ranks block, CairnCheckpointEngine(decoupled=True), "
            f"median of {n}", med["decoupled_save_s"] + extra, base, med["torch_s"], "s", None,
            f"save_checkpoint returns after {med['decoupled_save_s'] * 1e3:.0f} ms (bytes in the arena); the commit "
            f"in the next optimizer step adds {extra * 1e3:.0f} ms to it ({med['decoupled_commit_step_s'] * 1e3:.0f}"
            f" ms against {med['plain_step_s'] * 1e3:.0f} ms for a plain step)"),
    ]


# ---- Lightning ----

def run_lightning(a, tmp):
    warnings.simplefilter("ignore")
    import logging
    import torch
    from torch import nn
    from torch.nn import functional as F
    import lightning.pytorch as pl
    from lightning.fabric.plugins import TorchCheckpointIO
    from lightning.pytorch.callbacks import ModelCheckpoint

    import cairn
    from bench_daemon import Daemon
    from cairn.lightning import CairnCheckpointIO

    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    width, depth = (256, 4) if a.quick else (1024, 24)
    epochs = a.epochs or (3 if a.quick else 20)

    class Net(pl.LightningModule):
        """A frozen body of `depth` linear layers under a trainable head (Adam): a fine-tuning run."""

        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(width, width), nn.ReLU())])
            self.head = nn.Linear(width, 10)
            self.body.requires_grad_(False)

        def forward(self, x):
            return self.head(self.body(x))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self(x), y)

        def configure_optimizers(self):
            return torch.optim.Adam(self.head.parameters(), lr=1e-3)

    g = torch.Generator().manual_seed(7)
    data = torch.utils.data.TensorDataset(torch.randn(128, width, generator=g), torch.randint(0, 10, (128,), generator=g))

    def timing(cls):
        class Timed(cls):
            def save_checkpoint(self, *args, **kwargs):
                t0 = time.perf_counter()
                super().save_checkpoint(*args, **kwargs)
                self.save_s.append(time.perf_counter() - t0)
        return Timed

    def fit(plugin, dirpath):
        plugin.save_s = []
        torch.manual_seed(0)
        model = Net()
        ckpt = ModelCheckpoint(dirpath=dirpath, save_top_k=-1, every_n_epochs=1)
        trainer = pl.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, enable_progress_bar=False, logger=False,
                             enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                             default_root_dir=dirpath, plugins=[plugin], callbacks=[ckpt])
        trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=32))
        return model, sorted(Path(dirpath).iterdir(), key=lambda p: p.stat().st_mtime_ns)

    out = {"epochs": epochs, "body_bytes": depth * (width * width + width) * 4}
    d = Daemon(BUILD, tmp, mib(4 * out["body_bytes"])).start()
    try:
        c = cairn.connect(d.socket)
        plugin = timing(TorchCheckpointIO)()
        model, files = fit(plugin, tmp / "torch")
        want = digests(model.state_dict())
        compare("Lightning: the last checkpoint of the fit with TorchCheckpointIO",
                digests(torch.load(files[-1], weights_only=False)["state_dict"]), want)
        out["torch"] = {"save_s": plugin.save_s, "bytes": tree_bytes(tmp / "torch"), "checkpoints": len(files)}
        del model
        runs = [("memory", "cairn")] + ([] if a.quick else [("global", "cairn-global")])
        for durability, name in runs:
            plugin = timing(CairnCheckpointIO)(d.socket, durability=durability)
            repo0 = tree_bytes(tmp / "repo")
            physical0 = c.stats()["repository"]["physical_bytes"]
            model, files = fit(plugin, tmp / name)
            c.flush(timeout=1800)
            last = plugin.load_checkpoint(files[-1])
            compare(f"Lightning: the last checkpoint of the fit with CairnCheckpointIO({durability!r})",
                    digests(last["state_dict"]), digests(model.state_dict()))
            if len(files) != out["torch"]["checkpoints"]:
                raise Mismatch(f"Lightning: {len(files)} checkpoints with CairnCheckpointIO({durability!r}), "
                               f"{out['torch']['checkpoints']} with TorchCheckpointIO")
            out[name] = {"save_s": plugin.save_s, "pointer_bytes": tree_bytes(tmp / name),
                         "repository_bytes": tree_bytes(tmp / "repo") - repo0,
                         "physical_bytes": c.stats()["repository"]["physical_bytes"] - physical0,
                         "checkpoints": len(files)}
            del model, last
        c.close()
    finally:
        d.stop()
    return out


def lightning_rows(r):
    t, m = r["torch"], r["cairn"]
    n = r["epochs"]
    what = (f"Lightning fit of {n} epochs, a checkpoint each epoch ({t['checkpoints']} kept), "
            f"{r['body_bytes'] / 1e6:.0f} MB frozen body under a trainable head")
    base = "Lightning's default TorchCheckpointIO"
    rows = [row(f"{what}: bytes stored, CairnCheckpointIO", m["repository_bytes"] + m["pointer_bytes"],
                f"{base} (the checkpoint files)", t["bytes"], "bytes", GOALS["lightning_bytes"],
                f"the repository directory's growth after the flush ({m['physical_bytes'] / 1e6:.1f} MB of chunk "
                f"data) and {m['pointer_bytes']} bytes of pointer files"),
            row(f"{what}: time in save_checkpoint over the fit, CairnCheckpointIO(durability='memory')",
                sum(m["save_s"]), base, sum(t["save_s"]), "s", GOALS["lightning_time"],
                f"first checkpoint {m['save_s'][0] * 1e3:.0f} ms against {t['save_s'][0] * 1e3:.0f} ms; later ones "
                f"median {statistics.median(m['save_s'][1:] or m['save_s']) * 1e3:.1f} ms against "
                f"{statistics.median(t['save_s'][1:] or t['save_s']) * 1e3:.1f} ms")]
    gl = r.get("cairn-global")
    if gl:
        rows.append(row(f"{what}: time in save_checkpoint over the fit, CairnCheckpointIO (durability 'global', "
                        "its default)", sum(gl["save_s"]), f"{base} (no fsync)", sum(t["save_s"]), "s", None,
                        "each save waits until the checkpoint is in the repository"))
    return rows


# ---- transformers ----

def run_transformers(a, tmp):
    warnings.simplefilter("ignore")
    import gc
    import torch
    from transformers import BertConfig, BertModel
    from transformers.utils import logging as hf_logging

    import cairn
    import cairn.transformers as ctf
    from bench_daemon import Daemon, drop_caches

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    cfg = (BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512,
                      vocab_size=4096) if a.quick else BertConfig())
    torch.manual_seed(0)
    model = BertModel(cfg)
    want = digests(model.state_dict())
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    local = tmp / "bert"
    model.save_pretrained(local)
    del model
    d = Daemon(BUILD, tmp, mib(2.5 * nbytes)).start()
    out = {"params_bytes": nbytes, "hf_s": [], "cairn_s": [], "bert_base": not a.quick}
    try:
        c = cairn.connect(d.socket)
        ctf.save_pretrained(BertModel.from_pretrained(local), "bert-base", client=c)

        def load_hf():
            return BertModel.from_pretrained(local)

        def load_cairn():
            return ctf.from_pretrained(BertModel, "bert-base", client=c)

        ways = [("hf_s", load_hf), ("cairn_s", load_cairn)]
        for key, fn in ways:  # a first load of each, checked
            m = fn()
            compare(f"transformers: {key[:-2]} warm load", digests(m.state_dict()), want)
            del m
        for rep in range(a.repeats):
            for key, fn in (ways[::-1] if rep % 2 else ways):
                gc.collect()
                t0 = time.perf_counter()
                m = fn()
                out[key].append(time.perf_counter() - t0)
                del m
        # Cold: the daemon restarted on its repository (nothing in its memory), the page cache dropped.
        c.close()
        d.stop()
        gc.collect()
        files = [p for p in local.rglob("*") if p.is_file()]
        out["cold_method"] = drop_caches(files)
        t0 = time.perf_counter()
        m = load_hf()
        out["hf_cold_s"] = time.perf_counter() - t0
        compare("transformers: cold load from the directory", digests(m.state_dict()), want)
        del m
        gc.collect()
        drop_caches(files + [p for p in (tmp / "repo").rglob("*") if p.is_file()])
        d.start()
        c = cairn.connect(d.socket)
        t0 = time.perf_counter()
        m = load_cairn()
        out["cairn_cold_s"] = time.perf_counter() - t0
        compare("transformers: cold load from cairn", digests(m.state_dict()), want)
        del m
        c.close()
    finally:
        d.stop()
    return out


def transformers_rows(r):
    size = f"{'BERT-base-sized' if r['bert_base'] else 'small'} BertModel ({r['params_bytes'] / 1e6:.0f} MB)"
    n = len(r["cairn_s"])
    return [row(f"from_pretrained of a {size}, warm: cairn.transformers from the daemon's memory, median of {n}",
                statistics.median(r["cairn_s"]), "transformers' from_pretrained of a local safetensors directory "
                "(page cache warm)", statistics.median(r["hf_s"]), "s", GOALS["transformers"]),
            row(f"from_pretrained of a {size}, cold: daemon restarted, page cache dropped ({r['cold_method']})",
                r["cairn_cold_s"], "transformers' from_pretrained of the directory, page cache dropped",
                r["hf_cold_s"], "s", None)]


# ---- a DeepHyper-style search ----

def run_nas(a, tmp):
    warnings.simplefilter("ignore")
    import torch
    from torch import nn
    from torch.nn import functional as F
    from safetensors import safe_open
    from safetensors.torch import save_file

    import cairn
    import cairn.torch as ct
    from bench_daemon import Daemon

    if a.quick:
        features, stem, widths, k, population, sample = 32, 32, [16, 32, 48, 64], a.candidates or 6, 4, 2
    else:
        features, stem, widths, k, population, sample = 512, 1024, [512, 1024, 1536, 2048], a.candidates or 24, 8, 3
    max_layers, classes, steps = 4, 10, 3
    rng = random.Random(0)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(256, features, generator=g), torch.randint(0, classes, (256,), generator=g)
    xv, yv = torch.randn(128, features, generator=g), torch.randint(0, classes, (128,), generator=g)
    torch.set_num_threads(os.cpu_count() or 1)

    def build(config):
        mods, w = [nn.Linear(features, stem), nn.ReLU()], stem
        for u in config:
            mods += [nn.Linear(w, u), nn.ReLU()]
            w = u
        mods.append(nn.Linear(w, classes))
        torch.manual_seed(1)
        return nn.Sequential(*mods)

    def expected_keys(config, parent):
        """The state-dict keys whose layer and everything upstream match between the two MLPs."""
        keys = ["0.weight", "0.bias"]
        n = 0
        while n < min(len(config), len(parent)) and config[n] == parent[n]:
            keys += [f"{2 + 2 * n}.weight", f"{2 + 2 * n}.bias"]
            n += 1
        if list(config) == list(parent):
            keys += [f"{2 + 2 * n}.weight", f"{2 + 2 * n}.bias"]
        return keys

    def first_batch(model, transferred):
        for key, p in model.named_parameters():
            p.requires_grad_(key not in transferred)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.Adam(params, lr=1e-3) if params else None
        if opt:
            opt.zero_grad()
            F.cross_entropy(model(x[:64]), y[:64]).backward()
            opt.step()
        return opt

    prefix = "nas/"
    files = tmp / "files"
    files.mkdir()
    d = Daemon(BUILD, tmp, "1024MiB").start()
    out = {"candidates": k, "cairn_s": [], "torch_s": [], "safetensors_s": [], "transferred_bytes": [],
           "model_bytes": [], "with_parent": 0}
    try:
        c = cairn.connect(d.socket)
        repo0 = tree_bytes(tmp / "repo")
        stored = {}   # id -> (config, score)
        pop = []      # the live population, oldest first
        for i in range(k):
            if i == 0:
                config = [stem, stem]  # the default configuration: the seed, stored first
            elif i < population:
                config = [rng.choice(widths) for _ in range(rng.randint(1, max_layers))]
            else:
                best = max(rng.sample(pop, sample), key=lambda m: stored[m][1])
                config = list(stored[best][0])
                what = rng.randrange(max_layers + 1)
                if what == max_layers or what >= len(config):
                    n = rng.randint(1, max_layers)
                    config = (config + [rng.choice(widths) for _ in range(max_layers)])[:n]
                else:
                    config[what] = rng.choice([w for w in widths if w != config[what]])
            mid = f"{prefix}c{i}"
            models, ttfb, parent, plan = {}, {}, None, {}

            def way_cairn():
                t0 = time.perf_counter()
                m = build(config)
                where = {"search": prefix}
                ans = c.best_ancestor(ct.architecture(m), where)
                got = {"model": None, "tensors": {}}
                if ans.get("model"):
                    c.hint("will_load", [ans["model"]], when="next")
                    got = ct.transfer(m, client=c, where=where)
                opt = first_batch(m, got["tensors"])
                ttfb["cairn_s"] = time.perf_counter() - t0
                models["cairn"] = (m, opt)
                return got

            def way_file(kind):
                def run():
                    t0 = time.perf_counter()
                    m = build(config)
                    if parent:
                        targets = m.state_dict()
                        with torch.no_grad():
                            if kind == "torch":
                                sd = torch.load(files / f"{parent.replace('/', '_')}.pt", weights_only=True)
                                for key, src in plan.items():
                                    targets[key].copy_(sd[src])
                            else:
                                with safe_open(str(files / f"{parent.replace('/', '_')}.safetensors"), "pt") as f:
                                    for key, src in plan.items():
                                        targets[key].copy_(f.get_tensor(src))
                    first_batch(m, plan)
                    ttfb[f"{kind}_s"] = time.perf_counter() - t0
                    models[kind] = (m, None)
                return run

            # cairn finds the ancestor; the file ways are then given it and the layers to copy.
            ways = [("cairn", way_cairn), ("torch", way_file("torch")), ("safetensors", way_file("safetensors"))]
            if i % 3 == 0:
                order = ways
            else:  # cairn must run first to name the ancestor; the file ways take turns after it,
                order = [ways[0]] + (ways[1:] if i % 2 else ways[:0:-1])  # and cairn's cache is warm anyway
            got = order[0][1]()
            parent, plan = got["model"], dict(got["tensors"])
            for _, fn in order[1:]:
                fn()
            if parent:
                pconf = stored[parent][0]
                want = expected_keys(config, pconf)
                longest = max(len(expected_keys(config, s[0])) for s in stored.values())
                if sorted(plan) != sorted(want) or len(want) < longest:
                    raise Mismatch(f"NAS candidate {mid} {config}: cairn transferred {sorted(plan)} from {parent} "
                                   f"{pconf}; the matching prefix is {want}, the longest stored one {longest} keys")
                ref = digests({k_: models["cairn"][0].state_dict()[k_] for k_ in sorted(plan)})
                for kind in ("torch", "safetensors"):
                    compare(f"NAS candidate {mid}: layers transferred by {kind}",
                            digests({k_: models[kind][0].state_dict()[k_] for k_ in sorted(plan)}), ref)
                out["with_parent"] += 1
                for key in ttfb:
                    out[key].append(ttfb[key])
                out["transferred_bytes"].append(sum(models["cairn"][0].state_dict()[k_].numel() * 4 for k_ in plan))
            # Train the rest a few more steps, score, store: in cairn with its parent, and as files.
            m, opt = models["cairn"]
            for s in range(1, steps if opt else 0):
                opt.zero_grad()
                F.cross_entropy(m(x[64 * s:64 * s + 64]), y[64 * s:64 * s + 64]).backward()
                opt.step()
            with torch.no_grad():
                score = float((m(xv).argmax(1) == yv).float().mean())
            ct.save(m, mid, parent=parent, client=c,
                    meta={"search": prefix, "score": score, "config": config})
            sd = {k_: v.detach().contiguous() for k_, v in m.state_dict().items()}
            torch.save(sd, files / f"{mid.replace('/', '_')}.pt")
            save_file(sd, str(files / f"{mid.replace('/', '_')}.safetensors"))
            out["model_bytes"].append(sum(v.numel() * 4 for v in sd.values()))
            stored[mid] = (config, score)
            pop.append(mid)
            if len(pop) > population:
                pop.pop(0)
            c.hint("population", list(pop))
            models.clear()
        c.flush(timeout=1800)
        out["repository_bytes"] = tree_bytes(tmp / "repo") - repo0
        out["physical_bytes"] = c.stats()["repository"]["physical_bytes"]
        out["torch_bytes"] = sum(p.stat().st_size for p in files.glob("*.pt"))
        out["safetensors_bytes"] = sum(p.stat().st_size for p in files.glob("*.safetensors"))
        c.close()
    finally:
        d.stop()
    return out


def nas_rows(r):
    k, n = r["candidates"], r["with_parent"]
    what = (f"search of {k} MLP candidates (regularized evolution, {statistics.mean(r['model_bytes']) / 1e6:.1f} MB "
            f"per model on average)")
    note = (f"{n} candidates with an ancestor; {statistics.median(r['transferred_bytes']) / 1e6:.1f} MB transferred "
            "(median); the file ways are told the ancestor and layers cairn found")
    med = {key: statistics.median(r[key]) for key in ("cairn_s", "torch_s", "safetensors_s")}
    return [row(f"{what}: time to first batch of a candidate (build, ancestor, transfer, first step), median",
                med["cairn_s"], "one torch.save file per model (torch.load of the ancestor's)", med["torch_s"], "s",
                None, note),
            row(f"{what}: time to first batch of a candidate, median", med["cairn_s"],
                "one safetensors file per model (safe_open, the matching tensors only)", med["safetensors_s"], "s",
                None, note),
            row(f"{what}: bytes stored", r["repository_bytes"], "one torch.save file per model", r["torch_bytes"],
                "bytes", None, f"the repository directory's growth after the flush "
                f"({r['physical_bytes'] / 1e6:.1f} MB of chunk data)"),
            row(f"{what}: bytes stored", r["repository_bytes"], "one safetensors file per model",
                r["safetensors_bytes"], "bytes", None)]


# ---- the driver ----

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--role", choices=["driver", "ds-rank"], default="driver")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default=",".join(PARTS), help="comma-separated: " + ", ".join(PARTS))
    ap.add_argument("--repeats", type=int, default=0, help="repeats of the timed saves and loads (default 3; quick 1)")
    ap.add_argument("--epochs", type=int, default=0, help="Lightning epochs (default 20; quick 3)")
    ap.add_argument("--candidates", type=int, default=0, help="NAS candidates (default 24; quick 6)")
    ap.add_argument("--dir", help="where repositories and checkpoint files go (one filesystem)")
    ap.add_argument("--json", required=True)
    ap.add_argument("--socket", help=argparse.SUPPRESS)
    ap.add_argument("--gpt2", help=argparse.SUPPRESS)
    ap.add_argument("--seq", type=int, default=64, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.role == "ds-rank":
        return ds_rank(a)
    a.repeats = a.repeats or (1 if a.quick else 3)
    only = [p for p in a.only.split(",") if p]
    unknown = set(only) - set(PARTS)
    if unknown:
        ap.error(f"--only: unknown parts {sorted(unknown)}; choose from {', '.join(PARTS)}")
    # The machine's load average (1 minute) as each sub-part starts and ends: on a shared machine the
    # timings are only as steady as it is.
    report = {"quick": a.quick, "cores": os.cpu_count(), "seconds": {}, "load_average": {}, "rows": []}
    runs = {"deepspeed": (run_deepspeed, deepspeed_rows), "lightning": (run_lightning, lightning_rows),
            "transformers": (run_transformers, transformers_rows), "nas": (run_nas, nas_rows)}
    for part in PARTS:
        if part not in only:
            continue
        t0 = time.time()
        load0 = os.getloadavg()[0]
        fn, rows_of = runs[part]
        with tempfile.TemporaryDirectory(prefix=f"cairn-bench-{part}-", dir=a.dir) as tmp:
            r = fn(a, Path(tmp))
        report[part] = r
        report["rows"] += rows_of(r)
        report["seconds"][part] = round(time.time() - t0, 1)
        report["load_average"][part] = [round(load0, 2), round(os.getloadavg()[0], 2)]
        print(f"{part}: {report['seconds'][part]} s", flush=True)
    Path(a.json).write_text(json.dumps(report, indent=1))
    from bench_daemon import print_rows
    print_rows(report["rows"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
