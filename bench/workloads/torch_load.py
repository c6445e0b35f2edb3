#!/usr/bin/env python3
"""Loading a model into PyTorch: cairn against torch.load and safetensors' load_file, same weights,
same run, warm and cold.

Models: torchvision's ResNet-50 and a BERT-base-sized encoder built with torch.nn (token, position
and type embeddings, 12 TransformerEncoderLayers of width 768 with 12 heads and 3072-wide FFNs, a
pooler): 97.5 MiB and 418 MiB of float32.

Ways of loading, each giving a dict name -> torch.Tensor:
  cairn.torch.load      tensors that own their memory (one copy out of the daemon's shared arena)
  cairn zero-copy       cairn.Client.load_model views wrapped with torch.from_numpy (no copy; the
                        tensors are read-only views of the arena, valid while referenced)
  torch.load            of a torch.save file (weights_only=True, map_location cpu)
  safetensors load_file of a safetensors file (PyPI safetensors, torch backend)

Each is timed twice: the load alone (a state dict), and the load followed by load_state_dict into a
freshly built module (what a user does; it copies every byte, so lazy loaders pay for their reads
there: safetensors' load_file maps the file and reads on first touch). Warm: everything in memory already (the daemon's arena; the files in the page cache); the median of
--repeats loads. Cold: the page cache dropped (as root: /proc/sys/vm/drop_caches; otherwise
posix_fadvise(DONTNEED) on every file, which the output says) and, for cairn, a freshly started
daemon, so the bytes come from the repository; one load each.

Usage: bench/workloads/torch_load.py [--repeats 5] [--quick] [--json FILE]
  --quick: ResNet-50 only, 3 repeats (a correctness run for scripts/test).
Needs a build (scripts/build): it starts build/bin/cairnd itself and stops it by pid.
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("CAIRN_BUILD_DIR", ROOT / "build"))
sys.path.insert(0, str(ROOT / "api" / "python"))
os.environ.setdefault("CAIRN_LIBRARY", str(BUILD / "lib" / "libcairn.so"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torchvision  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

import cairn  # noqa: E402
import cairn.torch as ct  # noqa: E402
from bench_daemon import Daemon, drop_caches  # noqa: E402


def bert_base_module():
    torch.manual_seed(0)
    d, layers = 768, 12
    m = torch.nn.ModuleDict({
        "word_embeddings": torch.nn.Embedding(30522, d),
        "position_embeddings": torch.nn.Embedding(512, d),
        "token_type_embeddings": torch.nn.Embedding(2, d),
        "embeddings_norm": torch.nn.LayerNorm(d),
        "encoder": torch.nn.TransformerEncoder(
            torch.nn.TransformerEncoderLayer(d, 12, dim_feedforward=3072, batch_first=True), layers),
        "pooler": torch.nn.Linear(d, d),
    })
    return m


def resnet50_module():
    torch.manual_seed(0)
    return torchvision.models.resnet50()


def same(a, b):
    # safetensors returns its tensors sorted by name, the others in the state dict's order.
    return set(a) == set(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    repeats = 3 if args.quick else args.repeats
    models = [("ResNet-50", resnet50_module)] + ([] if args.quick else [("BERT-base", bert_base_module)])

    root = Path(tempfile.mkdtemp(prefix="cairn-bench-torch-", dir=os.environ.get("TMPDIR", "/var/tmp")))
    results = {"machine": {"cpus": os.cpu_count()}, "models": {}}
    d = Daemon(BUILD, root, "2GiB").start()
    try:
        c = cairn.connect(d.socket)
        for name, make in models:
            module = make()
            state = {k: v.contiguous() for k, v in module.state_dict().items()}
            nbytes = sum(v.numel() * v.element_size() for v in state.values())
            pt, st = root / f"{name}.pt", root / f"{name}.safetensors"
            torch.save(state, pt)
            save_file(state, str(st))
            ct.save(state, name, client=c)

            ways = {
                "cairn.torch.load": lambda n=name: ct.load(n, client=c),
                "cairn zero-copy": lambda n=name: {k: torch.from_numpy(v) for k, v in c.load_model(n).items()},
                "torch.load": lambda p=pt: torch.load(p, map_location="cpu", weights_only=True),
                "safetensors load_file": lambda p=st: load_file(str(p)),
            }
            import warnings
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            row = {"bytes": nbytes, "warm_s": {}, "warm_module_s": {}, "cold_s": {}}
            target = make()  # a fresh module to load into (load_state_dict copies every byte)
            for way, fn in ways.items():
                fn()  # warm up (arena resident, files cached)
                times, into = [], []
                for _ in range(repeats):
                    t, out = timed(fn)
                    times.append(t)
                    if not same(out, state):
                        raise SystemExit(f"{way} gave different tensors for {name}")
                    del out
                    t, _ = timed(lambda: target.load_state_dict(fn()))
                    into.append(t)
                row["warm_s"][way] = statistics.median(times)
                row["warm_module_s"][way] = statistics.median(into)
            del target
            results["models"][name] = row

        # Cold: a fresh daemon (empty arena, repository on disk) and dropped page cache.
        c.close()
        d.stop()
        d = Daemon(BUILD, root, "2GiB")
        for name, _ in models:
            row = results["models"][name]
            pt, st = root / f"{name}.pt", root / f"{name}.safetensors"
            files = [pt, st] + list((root / "repo" / "packs").iterdir())
            for way in ("cairn.torch.load", "torch.load", "safetensors load_file"):
                d.stop()
                how = drop_caches(files)
                target = dict(models)[name]()
                if way.startswith("cairn"):
                    d.start()
                    c = cairn.connect(d.socket)
                    t, _ = timed(lambda: target.load_state_dict(ct.load(name, client=c)))
                    c.close()
                elif way == "torch.load":
                    t, _ = timed(lambda: target.load_state_dict(torch.load(pt, map_location="cpu", weights_only=True)))
                else:
                    t, _ = timed(lambda: target.load_state_dict(load_file(str(st))))
                del target
                row["cold_s"][way] = t
            results["cold_method"] = how
    finally:
        d.stop()
        shutil.rmtree(root, ignore_errors=True)

    print(f"loading into PyTorch (torch {torch.__version__}, {os.cpu_count()} CPUs); warm: median of {repeats}; "
          f"cold: one load after {results.get('cold_method', '?')} and a fresh cairnd")
    for name, row in results["models"].items():
        mib = row["bytes"] / 2**20
        print(f"\n{name} ({mib:.1f} MiB)")
        for key, what in (("warm_module_s", "warm, into a module"), ("warm_s", "warm, state dict only")):
            base_t, base_s = row[key]["torch.load"], row[key]["safetensors load_file"]
            for way, t in row[key].items():
                print(f"  {what:22s} {way:22s} {t * 1e3:8.1f} ms  {mib / 1024 / t:6.2f} GiB/s   "
                      f"speed-up vs torch.load {base_t / t:5.1f}x, vs safetensors {base_s / t:5.1f}x")
        cb_t, cb_s = row["cold_s"].get("torch.load"), row["cold_s"].get("safetensors load_file")
        for way, t in row["cold_s"].items():
            print(f"  {'cold, into a module':22s} {way:22s} {t * 1e3:8.1f} ms  {mib / 1024 / t:6.2f} GiB/s   "
                  f"speed-up vs torch.load {cb_t / t:5.1f}x, vs safetensors {cb_s / t:5.1f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
