#!/usr/bin/env python3
"""Ensemble load time on 16 to 4,096 nodes: cairn's peer group vs every node reading the PFS itself.

A discrete-event simulation (a heapq of timed events, standard library only), fed with costs measured
on a real machine (the bench passes them with --params), that predicts how long it takes until every
node of an ensemble holds the same base model.

Usage:
  python3 bench/workloads/peers_sim.py                     # defaults, prints a table
  python3 bench/workloads/peers_sim.py --params params.json --json out.json [--plot out.png]
  (any parameter below as a flag, e.g. --link-Bps 12.5e9 --nodes 16,256,4096; flags override --params)

Parameters (JSON keys; flags use dashes)
  model_bytes          the model (default: BERT-base fp32, pytorch_model.bin, 440,473,133 bytes)
  chunk_bytes          cairn's chunk (16 MiB; the last chunk is the remainder)
  nodes                list of node counts (16, 32, ..., 4096)
  pfs_aggregate_Bps    the filesystem's total bandwidth, shared by all concurrent readers
  pfs_per_client_Bps   one node's max read rate from the PFS (measured: a plain sequential file read)
  link_Bps             a node's NIC bandwidth for peer transfers, each direction (measured: the peer
                       stream bandwidth between two daemons)
  link_latency_s       per peer transfer: the fetch request to the holder and the first byte back
  lookup_rtt_s         per directory lookup: request to the chunk's home and the answer back
  window               outstanding chunk requests per node (4)
  upload_slots         fetches a holder sends at once; more wait in its FIFO queue (1)
  dispatch             "late" (default) or "eager": see the directory below
  order                "sequential" (default: every node asks for chunk 0, 1, 2, ...) or "rotated"
                       (node i starts at chunk i mod chunks and wraps around)
  jitter               +-fraction applied to every message latency, seeded (0.1)
  seed                 the jitter's seed (1); same parameters and seed -> same output

Baseline ("pfs"): at t=0 each of the N nodes opens the model and reads it as one sequential stream.
The PFS is a processor-sharing (fluid) resource: with n clients reading, each gets
min(pfs_per_client_Bps, pfs_aggregate_Bps / n) (max-min fair share; a client with k reads in flight
splits its share equally among them). Rates are recomputed at every start and finish, so the
simulation is exact for the fluid model. Result: the time until the slowest node has the whole model.

cairn: the model is split into ceil(model/chunk) chunks. Each node requests the chunks in order with
at most `window` requests outstanding; a request is a lookup to the chunk's directory (one-way
lookup_rtt_s/2 there, lookup_rtt_s/2 back with the answer). The directory follows the rules of
daemon/peers/directory.hpp:
  - no holder and no loader: the requester becomes the loader (kLoad) and reads the chunk from the
    PFS, sharing the PFS with every other reader exactly as in the baseline;
  - no holder but a loader: the requester is queued;
  - a holder exists: the requester is sent to the least-loaded holder (load = fetches it was sent and
    has not finished, counted per chunk as the directory does; ties: the earliest holder);
  - when a node finishes a chunk it tells the directory (add_holder, plus fetch_done for the holder it
    fetched from), one way, lookup_rtt_s/2; it is a holder of that chunk from then on and serves later
    requesters, so a chunk every node wants spreads as a tree.
Two dispatch rules for queued requesters (the choice matters, see below):
  - "eager", directory.hpp as written: every queued waiter is answered as soon as a holder appears,
    spread over the holders by load, and a lookup that finds holders is answered at once, however
    loaded they are. When all N nodes ask for a chunk at once, all N-1 waiters are bound to the one
    node that read it from the PFS and are served one after the other: no tree for that chunk.
  - "late" (default): the directory answers a requester only while the least-loaded holder has
    fewer than upload_slots fetches outstanding; otherwise the requester stays queued and is
    answered at the next fetch_done or add_holder. New holders therefore take over requesters as
    soon as they exist and the number of holders of a chunk doubles every transfer time: the tree
    the design describes. (It needs the directory to keep waiters until a holder has a free slot.)
A peer transfer: the answer reaches the requester, after link_latency_s more the request is at the
holder, which sends up to upload_slots fetches at once (FIFO for the rest, across all chunks it
holds). While a fetch is being sent its rate is
    min(link_Bps / uploads active at the sender, link_Bps / downloads active at the receiver),
recomputed whenever either end starts or finishes a transfer. This approximates max-min fairness
from below (max-min gives every flow at least the smaller of its two equal shares; here a sender
whose receivers are limited elsewhere leaves its spare capacity unused), so it errs against cairn;
a receiver has at most `window` downloads since it has at most `window` requests outstanding. A node's finish time is when its last chunk has arrived.
Checks (asserted): bytes read from the PFS by cairn == model_bytes (each chunk read exactly once) and
bytes sent over the network == (N-1) * model_bytes.

Reported per N: baseline and cairn times, cairn/baseline, cairn vs one node alone reading the model
from the PFS (model / min(per_client, aggregate)), PFS and network bytes.

What the model shows with the defaults (see the table it prints): "eager" (directory.hpp as written)
grows linearly in N and is slower than every node reading the PFS (the first node to reach a chunk
loads it while the others queue behind it, and all of them are then bound to it, so nearly all
bytes leave through one NIC); "late" grows only with log N. With order "sequential" the node ahead
of the others becomes the loader of every next chunk, so cairn's time stays close to one node
reading the whole model from the PFS at pfs_per_client_Bps; "rotated" spreads the PFS reads over
the nodes and approaches model / link_Bps. The directory counts load per chunk, not per node, so a
holder may be sent fetches for several chunks at once; they wait in its FIFO (this costs cairn time
when the link is slow: the per-node lower bound model / link_Bps is then missed by 2.5 to 4x).

What it omits: the PFS's and the peers' traffic sharing one NIC (they are independent here; the PFS
client rate is capped by pfs_per_client_Bps only), network topology and switch/bisection limits (the
fabric is non-blocking: only the end NICs limit a transfer), PFS metadata/open cost and the PFS's
per-request latency (only bandwidth), the directory's own CPU cost (its homes are spread over the
members; a lookup costs lookup_rtt_s whatever the load), the time to copy a received chunk into the
DRAM tier, failures, timeouts and membership changes, and the cost of turning the cached chunks into
the application's tensors (the same for both, after the load). Messages other than lookups, answers,
fetch requests and holder notices are not modelled. The jitter (seeded) only breaks the ties of a
perfectly synchronous start; without it one node would win every race.
"""
import argparse
import heapq
import json
import math
import random
import sys
from pathlib import Path

MiB = 1 << 20

DEFAULTS = {
    "model_bytes": 440_473_133,  # bert-base-uncased pytorch_model.bin (fp32)
    "chunk_bytes": 16 * MiB,
    "nodes": [16 << i for i in range(9)],  # 16 .. 4096
    "pfs_aggregate_Bps": 50e9,
    "pfs_per_client_Bps": 2e9,
    "link_Bps": 12.5e9,  # 100 Gb/s
    "link_latency_s": 20e-6,
    "lookup_rtt_s": 50e-6,
    "window": 4,
    "upload_slots": 1,
    "dispatch": "late",
    "order": "sequential",
    "jitter": 0.1,
    "seed": 1,
}


class Pfs:
    """The shared filesystem as a fluid processor-sharing resource.

    Each client (node) with reads in flight gets min(per_client, aggregate / active clients); its
    reads split that equally. One pending event (the next completion), invalidated by a version.
    """

    def __init__(self, sim, aggregate_Bps, per_client_Bps):
        self.sim = sim
        self.aggregate = aggregate_Bps
        self.per_client = per_client_Bps
        self.flows = {}  # id -> [remaining, rate, node, payload]
        self.per_node = {}  # node -> flows in flight
        self.last = 0.0
        self.version = 0
        self.next_id = 0
        self.bytes = 0

    def _advance(self, now):
        dt = now - self.last
        if dt > 0:
            for f in self.flows.values():
                f[0] -= f[1] * dt
        self.last = now

    def _reschedule(self, now):
        self.version += 1
        if not self.flows:
            return
        node_rate = min(self.per_client, self.aggregate / len(self.per_node))
        first = math.inf
        for f in self.flows.values():
            f[1] = node_rate / self.per_node[f[2]]
            t = max(f[0], 0.0) / f[1]
            if t < first:
                first = t
        self.sim.push(now + first, PFS_DONE, self.version, 0, 0)

    def start(self, now, reads):
        """Starts reads [(node, nbytes, payload)] at `now` (all at once: one rate update)."""
        self._advance(now)
        for node, nbytes, payload in reads:
            self.flows[self.next_id] = [float(nbytes), 0.0, node, payload]
            self.next_id += 1
            self.per_node[node] = self.per_node.get(node, 0) + 1
            self.bytes += nbytes
        self._reschedule(now)

    def on_event(self, now, version):
        """Returns the payloads of the reads that finished (all that finish at this instant)."""
        if version != self.version:
            return []
        self._advance(now)
        done = []
        for fid, f in list(self.flows.items()):
            if f[0] <= 1.0 + f[1] * 1e-9:  # fluid rounding: under a byte or 1 ns worth left
                del self.flows[fid]
                n = self.per_node[f[2]] - 1
                if n:
                    self.per_node[f[2]] = n
                else:
                    del self.per_node[f[2]]
                done.append(f[3])
        self._reschedule(now)
        return done


# Event kinds.
PFS_DONE, LOOKUP, ANSWER, AT_HOLDER, XFER_DONE, NOTICE = range(6)


class Sim:
    def __init__(self):
        self.q = []
        self.seq = 0

    def push(self, t, kind, a, b, c):
        self.seq += 1
        heapq.heappush(self.q, (t, self.seq, kind, a, b, c))


def baseline(p, n):
    """Every node reads the whole model from the PFS at t=0; returns the slowest node's time."""
    sim = Sim()
    pfs = Pfs(sim, p["pfs_aggregate_Bps"], p["pfs_per_client_Bps"])
    pfs.start(0.0, [(node, p["model_bytes"], node) for node in range(n)])
    finished, last = 0, 0.0
    while sim.q:
        t, _, kind, a, _, _ = heapq.heappop(sim.q)
        done = pfs.on_event(t, a)
        finished += len(done)
        if done:
            last = t
    assert finished == n and pfs.bytes == n * p["model_bytes"]
    return last


def cairn(p, n):
    """The peer group; returns {time_s, pfs_bytes, net_bytes, pfs_reads, ...} for n nodes."""
    model, chunk = p["model_bytes"], p["chunk_bytes"]
    nchunks = max(1, -(-model // chunk))
    sizes = [min(chunk, model - i * chunk) for i in range(nchunks)]
    window, slots = int(p["window"]), int(p["upload_slots"])
    late = p["dispatch"] == "late"
    if p["dispatch"] not in ("late", "eager"):
        raise ValueError("dispatch must be 'late' or 'eager'")
    link, link_lat = p["link_Bps"], p["link_latency_s"]
    half_rtt = p["lookup_rtt_s"] / 2
    rng = random.Random(p["seed"])
    jit = p["jitter"]

    def delay(base):
        return base * (1.0 + jit * (2.0 * rng.random() - 1.0)) if jit else base

    sim = Sim()
    push = sim.push
    pfs = Pfs(sim, p["pfs_aggregate_Bps"], p["pfs_per_client_Bps"])

    # Node state.
    if p["order"] not in ("sequential", "rotated"):
        raise ValueError("order must be 'sequential' or 'rotated'")
    first = [i % nchunks if p["order"] == "rotated" else 0 for i in range(n)]
    next_req = [0] * n
    outstanding = [0] * n
    got = [0] * n
    finish = [0.0] * n
    # Directory state, per chunk.
    loader = [-1] * nchunks
    waiters = [[] for _ in range(nchunks)]  # FIFO (list + head index)
    whead = [0] * nchunks
    load = [dict() for _ in range(nchunks)]  # holder -> fetches outstanding
    order = [dict() for _ in range(nchunks)]  # holder -> when added (tie-break)
    heaps = [[] for _ in range(nchunks)]  # (load, order, holder), lazily invalidated
    # Senders: FIFO of (receiver, chunk) and active uploads; receivers: active downloads.
    sendq = [[] for _ in range(n)]
    sendhead = [0] * n
    ups = [[] for _ in range(n)]  # transfer ids
    downs = [[] for _ in range(n)]
    xfers = {}  # id -> [sender, receiver, chunk, remaining, rate, last_t, version]
    xid = 0
    net_bytes = 0

    def request_more(node, now):
        while outstanding[node] < window and next_req[node] < nchunks:
            c = (first[node] + next_req[node]) % nchunks
            next_req[node] += 1
            outstanding[node] += 1
            push(now + delay(half_rtt), LOOKUP, node, c, 0)

    def least_loaded(c):
        h = heaps[c]
        ld = load[c]
        while h:
            l, _, holder = h[0]
            if ld[holder] == l:
                return h[0]
            heapq.heappop(h)
        return None

    def bind(c, holder, requester, now):
        ld = load[c]
        ld[holder] += 1
        heapq.heappush(heaps[c], (ld[holder], order[c][holder], holder))
        push(now + delay(half_rtt), ANSWER, requester, c, holder)

    def dispatch(c, now):
        w = waiters[c]
        while whead[c] < len(w):
            top = least_loaded(c)
            if top is None or (late and top[0] >= slots):
                return
            bind(c, top[2], w[whead[c]], now)
            whead[c] += 1
        if whead[c]:
            del w[:]
            whead[c] = 0

    def set_rates(ids, now):
        for i in ids:
            x = xfers[i]
            x[3] -= x[4] * (now - x[5])
            x[5] = now
            rate = min(link / len(ups[x[0]]), link / len(downs[x[1]]))
            x[4] = rate
            x[6] += 1
            push(now + max(x[3], 0.0) / rate, XFER_DONE, i, x[6], 0)

    def try_send(s, now):
        nonlocal xid
        q = sendq[s]
        while len(ups[s]) < slots and sendhead[s] < len(q):
            r, c = q[sendhead[s]]
            sendhead[s] += 1
            i = xid
            xid += 1
            xfers[i] = [s, r, c, float(sizes[c]), 0.0, now, 0]
            ups[s].append(i)
            downs[r].append(i)
            set_rates(set(ups[s]) | set(downs[r]), now)
        if sendhead[s] == len(q) and q:
            del q[:]
            sendhead[s] = 0

    def chunk_arrived(node, now):
        outstanding[node] -= 1
        got[node] += 1
        if got[node] == nchunks:
            finish[node] = now
        request_more(node, now)

    for node in range(n):
        request_more(node, 0.0)

    q = sim.q
    pop = heapq.heappop
    while q:
        now, _, kind, a, b, c = pop(q)
        if kind == LOOKUP:  # at the directory: a = requester, b = chunk
            ch = b
            if load[ch]:
                top = least_loaded(ch)
                if not late or (top[0] < slots and whead[ch] == len(waiters[ch])):
                    bind(ch, top[2], a, now)
                else:
                    waiters[ch].append(a)
            elif loader[ch] < 0:
                loader[ch] = a
                push(now + delay(half_rtt), ANSWER, a, ch, -1)
            else:
                waiters[ch].append(a)
        elif kind == ANSWER:  # at the requester: a = node, b = chunk, c = holder or -1 (load)
            if c < 0:
                pfs.start(now, [(a, sizes[b], (a, b))])
            else:
                push(now + delay(link_lat), AT_HOLDER, c, a, b)
        elif kind == AT_HOLDER:  # the fetch request reached holder a from b for chunk c
            sendq[a].append((b, c))
            try_send(a, now)
        elif kind == XFER_DONE:
            x = xfers.get(a)
            if x is None or x[6] != b:
                continue
            s, r, ch = x[0], x[1], x[2]
            del xfers[a]
            ups[s].remove(a)
            downs[r].remove(a)
            net_bytes += sizes[ch]
            set_rates(set(ups[s]) | set(downs[r]), now)
            chunk_arrived(r, now)
            push(now + delay(half_rtt), NOTICE, r, ch, s)
            try_send(s, now)
        elif kind == PFS_DONE:
            for node, ch in pfs.on_event(now, a):
                chunk_arrived(node, now)
                push(now + delay(half_rtt), NOTICE, node, ch, -1)
        elif kind == NOTICE:  # at the directory: a holds chunk b now; fetched from c (-1: PFS)
            ch = b
            if c >= 0:
                load[ch][c] -= 1
                heapq.heappush(heaps[ch], (load[ch][c], order[ch][c], c))
            else:
                loader[ch] = -1
            order[ch][a] = len(order[ch])
            load[ch][a] = 0
            heapq.heappush(heaps[ch], (0, order[ch][a], a))
            dispatch(ch, now)

    assert all(g == nchunks for g in got), "a node did not get every chunk"
    assert pfs.bytes == model, f"PFS bytes {pfs.bytes} != model {model}"
    assert net_bytes == (n - 1) * model, f"network bytes {net_bytes} != (N-1) * model"
    return {"time_s": max(finish), "pfs_bytes": pfs.bytes, "net_bytes": net_bytes,
            "mean_s": sum(finish) / n, "chunks": nchunks}


def simulate(params=None):
    """Runs both models for every node count; returns {"params", "results": [row per N]}."""
    p = dict(DEFAULTS)
    p.update(params or {})
    single = p["model_bytes"] / min(p["pfs_per_client_Bps"], p["pfs_aggregate_Bps"])
    rows = []
    for n in p["nodes"]:
        n = int(n)
        b = baseline(p, n)
        c = cairn(p, n)
        rows.append({
            "nodes": n,
            "baseline_s": b,
            "cairn_s": c["time_s"],
            "cairn_mean_s": c["mean_s"],
            "ratio": c["time_s"] / b,
            "single_node_s": single,
            "cairn_vs_single": c["time_s"] / single,
            "pfs_bytes_cairn": c["pfs_bytes"],
            "pfs_bytes_baseline": n * p["model_bytes"],
            "net_bytes_cairn": c["net_bytes"],
            "chunks": c["chunks"],
        })
    return {"params": p, "results": rows}


def table(out):
    p = out["params"]
    lines = [
        f"model {p['model_bytes'] / 1e6:.1f} MB in {out['results'][0]['chunks'] if out['results'] else '?'} "
        f"chunks of {p['chunk_bytes'] / MiB:g} MiB; PFS {p['pfs_aggregate_Bps'] / 1e9:g} GB/s aggregate, "
        f"{p['pfs_per_client_Bps'] / 1e9:g} GB/s per client; link {p['link_Bps'] / 1e9:g} GB/s, "
        f"{p['link_latency_s'] * 1e6:g} us; lookup {p['lookup_rtt_s'] * 1e6:g} us; window {p['window']}, "
        f"upload_slots {p['upload_slots']}, dispatch {p['dispatch']}, order {p['order']}",
        f"{'nodes':>6} {'baseline s':>11} {'cairn s':>9} {'cairn/base':>10} {'cairn/1 node':>12} "
        f"{'PFS GB base':>11} {'PFS GB cairn':>12} {'net GB cairn':>12}",
    ]
    for r in out["results"]:
        lines.append(
            f"{r['nodes']:>6} {r['baseline_s']:>11.3f} {r['cairn_s']:>9.3f} {r['ratio']:>10.4f} "
            f"{r['cairn_vs_single']:>12.3f} {r['pfs_bytes_baseline'] / 1e9:>11.1f} "
            f"{r['pfs_bytes_cairn'] / 1e9:>12.3f} {r['net_bytes_cairn'] / 1e9:>12.1f}")
    return "\n".join(lines)


def plot(out, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = out["results"]
    xs = [r["nodes"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(xs, [r["baseline_s"] for r in rows], "o-", label="every node reads the PFS")
    ax.plot(xs, [r["cairn_s"] for r in rows], "s-", label=f"cairn peers ({out['params']['dispatch']})")
    ax.axhline(rows[0]["single_node_s"] if rows else 0, color="grey", ls=":", label="one node alone")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("nodes")
    ax.set_ylabel("time until every node holds the model (s)")
    ax.set_title(f"Ensemble load, {out['params']['model_bytes'] / 1e6:.0f} MB model (simulated)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", help="JSON file of parameters (keys as in DEFAULTS)")
    ap.add_argument("--json", help="write params and results here")
    ap.add_argument("--plot", help="draw time vs nodes here (PNG, needs matplotlib)")
    for k, v in DEFAULTS.items():
        flag = "--" + k.replace("_", "-")
        if k == "nodes":
            ap.add_argument(flag, help="comma-separated node counts")
        elif k == "dispatch":
            ap.add_argument(flag, choices=["late", "eager"])
        elif k == "order":
            ap.add_argument(flag, choices=["sequential", "rotated"])
        elif isinstance(v, int):
            ap.add_argument(flag, type=lambda x: int(float(x)))  # 4.4e8 is fine
        else:
            ap.add_argument(flag, type=float)
    args = ap.parse_args(argv)
    params = {}
    if args.params:
        params.update(json.loads(Path(args.params).read_text()))
    unknown = set(params) - set(DEFAULTS)
    if unknown:
        ap.error(f"unknown parameters in {args.params}: {sorted(unknown)}")
    for k in DEFAULTS:
        v = getattr(args, k)
        if v is not None:
            params[k] = [int(x) for x in v.split(",")] if k == "nodes" else v
    out = simulate(params)
    print(table(out))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    if args.plot:
        plot(out, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
