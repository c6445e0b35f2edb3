"""Near-data feature extraction (docs/near.md, bench part `near`): a "storage node" and a "trainer
node" on one machine, as two network namespaces joined by a veth pair whose storage side is shaped
with tc (tbf) to 1 and then 10 Gbit/s. The storage node runs cairnd with the compute worker
(compute.listen on its veth address) pinned to CPU 0; the trainer runs pinned to CPU 1, one torch
thread each, and reaches the worker over TCP through the shaped link.

Per model (torchvision ResNet-18, ResNet-50, VGG-11 with random weights; a synthetic image set made
in the run), fine-tuning the classifier head (every layer but the last frozen):
  vanilla   split 0: the storage side ships raw images, the trainer runs every layer (HAPI's baseline)
  auto      split="auto" (the cost model, from one profiling pass on each side and the measured
            link): epoch 1 with nothing cached, epoch 2 with the activations epoch 1 cached
  sweep     every split 0..frozen, one cold epoch each at 1 Gbit/s: the best split by trying all
Reported: payload bytes from the storage side per epoch, epoch seconds, the chosen and the best split.

A NAS run: candidates derived from one ResNet-18 parent that keep its first k layers (k = 6, 7, 8:
through layer2, layer3, layer4) frozen and train the rest from new weights, each trained one epoch,
with pushdown at k (activations cached by prefix signature) against vanilla: bytes, seconds, the
worker's forward passes through frozen layers against candidates x shards, the cache hit ratio.

Must run as root (namespaces, tc) where namespaces can be made; otherwise it prints why and exits 3.
Usage: near_bench.py [--quick] [--json FILE]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BUILD = Path(os.environ.get("CAIRN_BUILD_DIR", ROOT / "build"))
EPOCHS = 3  # head fine-tuning: epochs declared to the cost model and run
NS_S, NS_T, DEV_S, DEV_T = "cairn-near-s", "cairn-near-t", "cnear-s", "cnear-t"
ADDR_S, ADDR_T = "10.231.7.1", "10.231.7.2"


def sh(*args, check=True):
    return subprocess.run(list(args), check=check, capture_output=True, text=True)


def netns_up():
    netns_down()
    sh("ip", "netns", "add", NS_S)
    sh("ip", "netns", "add", NS_T)
    sh("ip", "link", "add", DEV_S, "type", "veth", "peer", "name", DEV_T)
    sh("ip", "link", "set", DEV_S, "netns", NS_S)
    sh("ip", "link", "set", DEV_T, "netns", NS_T)
    for ns, dev, addr in ((NS_S, DEV_S, ADDR_S), (NS_T, DEV_T, ADDR_T)):
        sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
        sh("ip", "-n", ns, "link", "set", dev, "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")


def shape(rate):
    """tbf on the storage side's egress (data flows storage -> trainer), with a burst of 1 ms at rate."""
    burst = max(64 * 1024, int(float(rate.rstrip("gbit")) * 1e9 / 8 / 1000))
    sh("ip", "netns", "exec", NS_S, "tc", "qdisc", "replace", "dev", DEV_S, "root", "tbf", "rate", rate,
       "burst", str(burst), "latency", "20ms")


def netns_down():
    for ns in (NS_S, NS_T):
        sh("ip", "netns", "del", ns, check=False)


def in_ns(ns, cpu, args, env=None, **kw):
    return subprocess.run(["ip", "netns", "exec", ns, "taskset", "-c", str(cpu), *args], env=env, **kw)


# ---- the trainer side (a subprocess in the trainer namespace) ----

def trainer_main(spec):
    import torch
    import cairn
    import cairn.data
    import cairn.near as near

    torch.set_num_threads(1)
    c = cairn.connect(spec["socket"])
    module = near.load_module(c, spec["model"])
    frozen = near.spec_of(c, spec["model"])["frozen"]
    ls = near.layers(module)
    out = []
    info = cairn.data.info(spec["dataset"], c)
    with torch.inference_mode():  # warm up this process's kernels (both modes alike)
        module(torch.zeros((2, *info["x"]["shape"])))
    torch.manual_seed(0)
    for epoch in range(spec.get("epochs", 1)):
        t0 = time.perf_counter()
        stream = near.features(spec["model"], spec["dataset"], spec["split"], client=c, module=module,
                               address=spec["address"], depth=2, epochs=spec.get("declared", 1))
        t_plan = time.perf_counter() - t0
        rest = torch.nn.Sequential(*ls[stream.split:frozen]).eval()
        head = torch.nn.Sequential(*ls[frozen:]).train()
        opt = torch.optim.SGD(head.parameters(), lr=0.01)
        losses = []
        for acts, y in stream:
            with torch.no_grad():
                f = rest(acts)
            loss = torch.nn.functional.cross_entropy(head(f), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        stream.close()
        out.append({"epoch": epoch + 1, "split": stream.split, "seconds": time.perf_counter() - t0,
                    "plan_seconds": t_plan, "train_seconds": time.perf_counter() - t0 - t_plan, "bytes": stream.stats["bytes"], "cached": stream.stats["cached"],
                    "computed": stream.stats["computed"], "loss": losses[-1] if losses else None,
                    "plan": (stream.plan.table if stream.plan else None),
                    "bandwidth": (stream.plan.bandwidth if stream.plan else None)})
    print(json.dumps(out))


def run_trainer(env, spec):
    r = in_ns(NS_T, 1, [sys.executable, str(Path(__file__)), "--trainer", json.dumps(spec)], env=env,
              capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(f"trainer failed ({r.returncode}): {r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


# ---- the storage side and the experiments ----

def start_daemon(root, env):
    cfg = root / "cairn.yaml"
    sock = root / "cairnd.sock"
    cfg.write_text(f"socket: {sock}\nrepository: {root / 'repo'}\ntiers:\n  dram:\n    capacity: 4GiB\n"
                   f"compute:\n  enabled: true\n  python: {sys.executable}\n  listen: {ADDR_S}:0\n"
                   f"  memory: 2GiB\n  cache: 1GiB\n  start_timeout: 120s\n"
                   f"log:\n  level: warn\n  file: {root / 'cairnd.log'}\n")
    p = subprocess.Popen(["ip", "netns", "exec", NS_S, "taskset", "-c", "0", str(BUILD / "bin" / "cairnd"),
                          "--config", str(cfg)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while time.time() < deadline and not sock.exists():
        if p.poll() is not None:
            raise RuntimeError("cairnd exited: " + p.stderr.read().decode())
        time.sleep(0.05)
    time.sleep(0.2)
    return p, str(sock)


def models(quick):
    import torchvision
    if quick:
        return [("resnet18", torchvision.models.resnet18)]
    return [("resnet18", torchvision.models.resnet18), ("resnet50", torchvision.models.resnet50),
            ("vgg11", torchvision.models.vgg11)]


def experiment_model(c, env, sock, address, name, builder, quick, out):
    import cairn.near as near
    import torch
    torch.manual_seed(0)
    m = builder(num_classes=10).eval()
    frozen = len(near.layers(m)) - 1  # every layer but the classifier's last Linear
    near.save(m, name, frozen=frozen, builder=f"torchvision.models:{builder.__name__}", kwargs={"num_classes": 10},
              client=c, durability="memory")
    spec = {"socket": sock, "model": name, "dataset": "images", "address": address}
    row = {"model": name, "frozen": frozen, "layers": len(near.layers(m)), "rates": {}}
    for rate in (["1gbit"] if quick else ["1gbit", "10gbit"]):
        shape(rate)
        r = {}
        near.drop_cache(client=c)
        r["vanilla"] = run_trainer(env, dict(spec, split=0, epochs=1))[0]
        near.drop_cache(client=c)
        r["auto1"] = run_trainer(env, dict(spec, split="auto", epochs=1, declared=1))[0]
        near.drop_cache(client=c)
        r["auto"] = run_trainer(env, dict(spec, split="auto", epochs=EPOCHS, declared=EPOCHS))
        row["rates"][rate] = r
        v, a1 = r["vanilla"], r["auto1"]
        print(f"  {name} {rate}: vanilla {v['seconds']:.2f}s {v['bytes'] / 1e6:.2f}MB; auto for 1 epoch: split "
              f"{a1['split']} {a1['seconds']:.2f}s ({a1['plan_seconds']:.2f}s planning) {a1['bytes'] / 1e6:.2f}MB; auto for "
              f"{EPOCHS} epochs: " + ", ".join(f"split {e['split']} {e['seconds']:.2f}s {e['bytes'] / 1e6:.2f}MB"
                                                for e in r["auto"]), flush=True)
    shape("1gbit")
    sweep = []
    chosen = row["rates"]["1gbit"]["auto1"]["split"]
    splits = sorted({0, chosen, frozen}) if quick else range(frozen + 1)  # --quick: not every split
    for k in splits:
        near.drop_cache(client=c)
        e = run_trainer(env, dict(spec, split=k, epochs=1))[0]
        sweep.append({"split": k, "seconds": e["seconds"], "bytes": e["bytes"]})
    row["sweep_1gbit"] = sweep
    best = min(sweep, key=lambda s: s["seconds"])
    at = {s["split"]: s for s in sweep}
    row["best_split"], row["chosen_split"] = best["split"], chosen
    row["chosen_over_best"] = at[chosen]["seconds"] / best["seconds"]
    print(f"  {name}: best split {best['split']} ({best['seconds']:.2f}s), chosen {chosen} "
          f"({at[chosen]['seconds']:.2f}s, {row['chosen_over_best']:.2f}x the best)", flush=True)
    out.append(row)


def experiment_nas(c, env, sock, address, quick, shards):
    """Candidates keep the parent's first k layers (frozen) and train the rest from new weights."""
    import cairn.near as near
    import torch
    import torchvision
    torch.manual_seed(1)
    parent = torchvision.models.resnet18(num_classes=10).eval()
    near.save(parent, "nas-parent", frozen=10, builder="torchvision.models:resnet18", kwargs={"num_classes": 10},
              client=c, durability="memory")
    ks = [6, 7, 8] * (1 if quick else 2)
    names = []
    for i, k in enumerate(ks):
        torch.manual_seed(100 + i)
        cand = torchvision.models.resnet18(num_classes=10).eval()
        pl, cl = near.layers(parent), near.layers(cand)
        for a, b in zip(pl[:k], cl[:k]):
            b.load_state_dict(a.state_dict())
        name = f"nas-{i}-k{k}"
        near.save(cand, name, frozen=k, builder="torchvision.models:resnet18", kwargs={"num_classes": 10}, client=c,
                  parent="nas-parent", durability="memory")
        names.append((name, k))
    res = {"candidates": len(names), "shards": shards, "frozen": [k for _, k in names], "vanilla": {}, "pushdown": {}}
    shape("1gbit")
    for mode in ("vanilla", "pushdown"):
        near.drop_cache(client=c)
        before = near.worker_stats(client=c)
        secs = byts = 0.0
        for name, k in names:
            e = run_trainer(env, {"socket": sock, "model": name, "dataset": "images", "address": address,
                                  "split": 0 if mode == "vanilla" else k, "epochs": 1})[0]
            secs += e["seconds"]
            byts += e["bytes"]
        after = near.worker_stats(client=c)
        fwd = sum(after["forward"].values()) - sum(before["forward"].values())
        passes = after["counters"].get("layer_passes", 0) - before["counters"].get("layer_passes", 0)
        partial = after["counters"].get("partial_hits", 0) - before["counters"].get("partial_hits", 0)
        hits = after["counters"].get("cache_hits", 0) - before["counters"].get("cache_hits", 0)
        miss = after["counters"].get("cache_misses", 0) - before["counters"].get("cache_misses", 0)
        res[mode] = {"seconds": secs, "bytes": byts, "forward_shard_passes": fwd, "layer_passes": passes,
                     "naive_layer_passes": sum(k for _, k in names) * res["shards"] if mode == "pushdown" else 0,
                     "partial_hits": partial, "cache_hits": hits,
                     "cache_misses": miss, "hit_ratio": hits / (hits + miss) if hits + miss else None}
        print(f"  nas {mode}: {secs:.2f}s {byts / 1e6:.1f}MB, shard computations {fwd}, layer passes {passes}, "
              f"hits {hits} (partial {partial}), misses {miss}", flush=True)
    return res


# ---- the rows bench/run reports (harness.ratio: cairn / baseline, with their goals) ----

def harness_rows(d, ratio, quick):
    img = "x".join(map(str, d["image"]))
    rows = []
    for m in d["models"]:
        key = m["model"] == "resnet50"
        for rate, r in m["rates"].items():
            v, one, many = r["vanilla"], r["auto1"], r["auto"]
            goal_b, goal_t = ("<= 0.25", "<= 0.5") if key and rate == "1gbit" else (None, None)
            what = f"{m['model']} head fine-tuning, {d['samples']} images {img}, {rate.replace('gbit', ' Gbit/s')}"
            note = f"split {one['split']} of {m['frozen']} frozen, cost model told 1 epoch"
            rows.append(ratio("near", f"{what}: bytes from the storage side, one epoch, nothing cached", one["bytes"] / 1e6,
                              "vanilla (raw images, every layer on the trainer)", v["bytes"] / 1e6, "MB", "lower",
                              goal=goal_b, note=note))
            rows.append(ratio("near", f"{what}: epoch time, one epoch, nothing cached", one["seconds"], "vanilla",
                              v["seconds"], "s", "lower", goal=goal_t,
                              note=note + f"; includes {one['plan_seconds']:.2f} s of profiling and link probe"))
            n = len(many)
            splits = sorted({e["split"] for e in many})
            note = (f"split {'/'.join(map(str, splits))} of {m['frozen']}, cost model told {n} epochs; epoch 1 "
                    f"{many[0]['seconds']:.2f} s and {many[0]['bytes'] / 1e6:.2f} MB, later epochs "
                    + ", ".join(f"{e['seconds']:.2f} s" for e in many[1:]) + "; vanilla: its one measured epoch x "
                    f"{n}")
            rows.append(ratio("near", f"{what}: bytes from the storage side, {n} epochs",
                              sum(e["bytes"] for e in many) / 1e6, "vanilla", n * v["bytes"] / 1e6, "MB", "lower",
                              goal=goal_b, note=note))
            rows.append(ratio("near", f"{what}: time for {n} epochs", sum(e["seconds"] for e in many), "vanilla",
                              n * v["seconds"], "s", "lower", goal=goal_t))
        at = {s["split"]: s for s in m["sweep_1gbit"]}
        rows.append(ratio("near", f"{m['model']}: epoch time at the cost model's split ({m['chosen_split']}) vs the "
                          f"best of {'the 3 splits' if quick else 'every split'} tried ({m['best_split']}), 1 Gbit/s",
                          at[m["chosen_split"]]["seconds"], "best split", at[m["best_split"]]["seconds"], "s", "lower",
                          goal="<= 1.1", note="one cold epoch per split"))
    n = d["nas"]
    what = f"NAS, {n['candidates']} ResNet-18 candidates freezing {sorted(set(n['frozen']))} layers of one parent"
    p, v = n["pushdown"], n["vanilla"]
    rows.append(ratio("near", f"{what}: bytes from the storage side", p["bytes"] / 1e6, "vanilla", v["bytes"] / 1e6,
                      "MB", "lower"))
    rows.append(ratio("near", f"{what}: training time, all candidates", p["seconds"], "vanilla", v["seconds"], "s",
                      "lower"))
    rows.append(ratio("near", f"{what}: frozen-layer passes over shards by the worker", p["layer_passes"],
                      "one per candidate", p["naive_layer_passes"], "layer x shard", "lower",
                      note=f"cache hit ratio {p['hit_ratio']:.2f}: {p['cache_hits']} (candidate, shard) requests read "
                           f"cached activations, {p['cache_misses']} did not, {p['partial_hits']} of those starting "
                           "from a shorter cached prefix"))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--trainer")
    args = ap.parse_args()
    if args.trainer:
        return trainer_main(json.loads(args.trainer))
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        print("near_bench needs root, ip and tc (network namespaces and a shaped veth link)")
        return 3
    sys.path.insert(0, str(ROOT / "api" / "python"))
    import cairn
    import cairn.data as cdata
    import cairn.near as near

    env = dict(os.environ, CAIRN_COMPUTE_THREADS="1", PYTHONPATH=str(ROOT / "api" / "python"),
               CAIRN_LIBRARY=str(BUILD / "lib" / "libcairn.so"))
    samples, shard, size = (16, 8, 64) if args.quick else (32, 8, 112)
    try:
        netns_up()
    except subprocess.CalledProcessError as e:  # e.g. a container without CAP_SYS_ADMIN / CAP_NET_ADMIN
        netns_down()
        print(f"near_bench cannot make its network namespaces here ({' '.join(e.cmd)}: {e.stderr.strip()})")
        return 3
    root = Path(tempfile.mkdtemp(prefix="cairn-near-", dir="/tmp"))
    daemon = None
    try:
        daemon, sock = start_daemon(root, env)
        c = cairn.connect(sock)
        address = c._request({"op": "compute"})["listen"]
        cdata.save("images", cdata.synthetic_images(samples, shard, (3, size, size), seed=3), client=c,
                   durability="memory")
        result = {"image": [3, size, size], "samples": samples, "shard": shard, "address": address,
                  "cpu": "storage side CPU 0, trainer CPU 1, one torch thread each", "models": []}
        print(f"near: {samples} images of 3x{size}x{size} in shards of {shard}; worker at {address}", flush=True)
        for name, builder in models(args.quick):
            experiment_model(c, env, sock, address, name, builder, args.quick, result["models"])
        result["nas"] = experiment_nas(c, env, sock, address, args.quick, samples // shard)
        result["worker"] = near.worker_stats(client=c)["counters"]
        c.close()
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.wait(timeout=120)
        netns_down()
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
