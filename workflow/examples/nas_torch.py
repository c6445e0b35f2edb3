#!/usr/bin/env python3
"""Regularized-evolution NAS in PyTorch over cairn (cairn.torch): each child asks cairn for its best
stored ancestor, takes over every layer whose upstream structure matches (frozen), trains the rest
on a small synthetic image-classification task, and is saved with that ancestor as its parent, so
only the layers it trained are stored. Every candidate is also written with torch.save (+ fsync),
the usual one-file-per-model practice, to compare bytes and time in the same run.

    eval "$(scripts/env)"; cairnd &             # a daemon (docs/python.md)
    python3 workflow/examples/nas_torch.py --quick    # < 1 minute on 2 cores
    python3 workflow/examples/nas_torch.py            # a few minutes

Search space: a fixed stem, then three stages of (width, depth, kernel), a linear head. A mutation
changes one gene of one stage, so the stages before it (and their trained weights) are shared with
the parent. Regularized evolution (Real et al., 2019): a population of the latest P models,
tournaments of S, the oldest dies.
"""
from __future__ import annotations

import argparse
import collections
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "api" / "python"))  # the in-tree package

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import cairn  # noqa: E402
import cairn.torch as ct  # noqa: E402

WIDTHS, DEPTHS, KERNELS = (16, 24, 32), (1, 2, 3), (3, 5)
Genome = Tuple[Tuple[int, int, int], ...]  # per stage: (width, depth, kernel)


class Block(nn.Module):
    def __init__(self, cin: int, cout: int, k: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


class Net(nn.Module):
    def __init__(self, genome: Genome, classes: int) -> None:
        super().__init__()
        self.stem = Block(3, 16, 3, 1)
        c = 16
        for i, (w, d, k) in enumerate(genome):
            blocks = []
            for j in range(d):
                blocks.append(Block(c, w, k, 2 if j == 0 and i > 0 else 1))
                c = w
            setattr(self, f"stage{i}", nn.Sequential(*blocks))
        self.stages = len(genome)
        self.head = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for i in range(self.stages):
            x = getattr(self, f"stage{i}")(x)
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def random_genome(rng: random.Random) -> Genome:
    return tuple((rng.choice(WIDTHS), rng.choice(DEPTHS), rng.choice(KERNELS)) for _ in range(3))


def mutate(g: Genome, rng: random.Random) -> Genome:
    stages = [list(s) for s in g]
    i, gene = rng.randrange(len(stages)), rng.randrange(3)
    choices = (WIDTHS, DEPTHS, KERNELS)[gene]
    stages[i][gene] = rng.choice([v for v in choices if v != stages[i][gene]])
    return tuple(tuple(s) for s in stages)  # type: ignore[return-value]


def dataset(n: int, classes: int, size: int, seed: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A learnable synthetic task: each class is a smooth random pattern; samples are scaled, noisy
    copies of it."""
    g = torch.Generator().manual_seed(seed)
    templates = F.interpolate(torch.randn(classes, 3, 4, 4, generator=g), size=(size, size), mode="bilinear",
                              align_corners=False)
    y = torch.randint(0, classes, (n,), generator=g)
    x = templates[y] * (0.5 + torch.rand(n, 1, 1, 1, generator=g)) + 1.5 * torch.randn(n, 3, size, size, generator=g)
    split = n * 4 // 5
    return x[:split], y[:split], x[split:], y[split:]


def freeze(model: nn.Module, transferred: Dict[str, str]) -> List[nn.Module]:
    """Freezes the leaf modules whose tensors came from the ancestor; returns them (kept in eval
    mode while training, so that their BatchNorm statistics stay the ancestor's, byte for byte)."""
    frozen = []
    for name, m in model.named_modules():
        if next(m.children(), None) is None and any(k.startswith(name + ".") for k in transferred):
            for p in m.parameters():
                p.requires_grad_(False)
            frozen.append(m)
    return frozen


def train(model: nn.Module, frozen: List[nn.Module], data, epochs: int, batch: int) -> float:
    xtr, ytr, xte, yte = data
    params = [p for p in model.parameters() if p.requires_grad]
    if params:
        opt = torch.optim.Adam(params, lr=3e-3)
        for _ in range(epochs):
            model.train()
            for m in frozen:
                m.eval()
            perm = torch.randperm(len(xtr))
            for i in range(0, len(xtr), batch):
                idx = perm[i:i + batch]
                opt.zero_grad()
                F.cross_entropy(model(xtr[idx]), ytr[idx]).backward()
                opt.step()
    model.eval()
    with torch.no_grad():
        return float((model(xte).argmax(1) == yte).float().mean())


def mib(n: float) -> str:
    return f"{n / 2**20:8.2f} MiB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a small run (under a minute on 2 cores)")
    ap.add_argument("--population", type=int, help="P, the population size (default 8; 4 with --quick)")
    ap.add_argument("--cycles", type=int, help="children evaluated after the initial population (default 24; 10 with --quick)")
    ap.add_argument("--sample", type=int, default=3, help="S, the tournament size")
    ap.add_argument("--epochs", type=int, help="training epochs per candidate (default 2)")
    ap.add_argument("--socket", help="cairnd's socket (default: $CAIRN_SOCKET, else the per-user default)")
    ap.add_argument("--baseline-dir", help="where the torch.save files go (default: a temporary directory in the current one)")
    ap.add_argument("--no-freeze", action="store_true", help="also train the transferred layers (then nearly every tensor changes)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    population = args.population or (4 if args.quick else 8)
    cycles = args.cycles if args.cycles is not None else (10 if args.quick else 24)
    epochs = args.epochs or 2
    samples = 1000 if args.quick else 2000
    classes, size, batch = 10, 16, 100

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    data = dataset(samples, classes, size, args.seed)
    client = cairn.connect(args.socket)
    run = f"nas-torch/{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    base_dir = Path(args.baseline_dir) if args.baseline_dir else Path(tempfile.mkdtemp(prefix="nas-torch-", dir="."))
    base_dir.mkdir(parents=True, exist_ok=True)
    physical0 = client.stats()["repository"]["physical_bytes"]
    t_cairn = t_torch = t_transfer = t_train = 0.0
    file_bytes = logical = trained_tensors = all_tensors = 0
    n_transfers = 0
    alive: "collections.deque[Tuple[str, Genome, float]]" = collections.deque()
    history: List[Tuple[str, Genome, float, str]] = []
    t_run = time.perf_counter()
    print(f"run {run}: population {population}, {cycles} children, tournaments of {args.sample}, "
          f"{epochs} epoch(s) each, {len(data[0])} training images", flush=True)

    for k in range(population + cycles):
        mid = f"{run}/c{k:03d}"
        if k < population:
            genome, origin = random_genome(rng), "random"
        else:
            winner = max(rng.sample(list(alive), min(args.sample, len(alive))), key=lambda c: c[2])
            genome, origin = mutate(winner[1], rng), f"mutant of {winner[0].rsplit('/', 1)[1]}"
        model = Net(genome, classes)
        frozen: List[nn.Module] = []
        ancestor = None
        if k >= population:
            t0 = time.perf_counter()
            got = ct.transfer(model, client=client, where={"run": run})
            t_transfer += time.perf_counter() - t0
            if got["tensors"]:
                ancestor = got["model"]
                n_transfers += 1
                if not args.no_freeze:
                    frozen = freeze(model, got["tensors"])
        t0 = time.perf_counter()
        acc = train(model, frozen, data, epochs, batch)
        t_train += time.perf_counter() - t0

        state = model.state_dict()
        size_bytes = sum(t.numel() * t.element_size() for t in state.values())
        # cairn: only the tensors that differ from the ancestor's are stored (durable: "global").
        p0 = client.stats()["repository"]["physical_bytes"]
        t0 = time.perf_counter()
        ct.save(model, mid, parent=ancestor, meta={"run": run, "score": acc, "genome": [list(s) for s in genome]},
                client=client)
        t_cairn += time.perf_counter() - t0
        stored = client.stats()["repository"]["physical_bytes"] - p0
        # The baseline: one file per candidate, made durable.
        path = base_dir / f"c{k:03d}.pt"
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        t_torch += time.perf_counter() - t0
        file_bytes += path.stat().st_size
        logical += size_bytes
        n_trained = sum(1 for n, p in model.named_parameters() if p.requires_grad)
        trained_tensors += n_trained
        all_tensors += sum(1 for _ in model.parameters())

        alive.append((mid, genome, acc))
        if len(alive) > population:
            alive.popleft()
        history.append((mid, genome, acc, origin))
        src = f"<- {ancestor.rsplit('/', 1)[1]}" if ancestor else "from scratch"
        print(f"  c{k:03d} {str([list(s) for s in genome]):42} acc {acc:.3f}  {src:14} "
              f"stored {stored / 2**10:7.1f} KiB of {size_bytes / 2**10:7.1f} KiB  ({origin})", flush=True)

    total = time.perf_counter() - t_run
    physical = client.stats()["repository"]["physical_bytes"] - physical0
    best = max(history, key=lambda h: h[2])
    n = len(history)
    print(f"\nbest {best[0]} acc {best[2]:.3f} genome {[list(s) for s in best[1]]}")
    print(f"{n} candidates in {total:.1f} s (training {t_train:.1f} s); {n_transfers} of {cycles} children "
          f"started from a stored ancestor (transfer queries {t_transfer:.2f} s in all); "
          f"{trained_tensors} of {all_tensors} parameter tensors trained")
    print(f"  bytes stored   cairn repository {mib(physical)} | torch.save, one file per model {mib(file_bytes)}"
          f"  ({file_bytes / max(1, physical):.1f}x smaller; {mib(logical)} of tensors in all)")
    print(f"  save, total    cairn.torch.save (global) {t_cairn:6.2f} s | torch.save + fsync {t_torch:6.2f} s"
          f"  (per model {t_cairn / n * 1e3:.1f} ms vs {t_torch / n * 1e3:.1f} ms)")
    lineage = client.lineage(best[0])
    print(f"  lineage of the best: {' <- '.join([best[0].rsplit('/', 1)[1]] + [a.rsplit('/', 1)[1] for a in lineage['ancestors']])}")
    if not args.baseline_dir:
        shutil.rmtree(base_dir, ignore_errors=True)
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
