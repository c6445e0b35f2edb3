#!/usr/bin/env python3
"""The torture harness: real daemons under a randomized mixed load while faults are
injected at random moments, and an oracle that checks after every fault and at the end that nothing
acknowledged was lost and nothing wrong was served. docs/reliability.md says what it guarantees.

    tests/torture/run --seed 7 --duration 60                 # one daemon
    tests/torture/run --seed 7 --duration 60 --daemons 3     # a peer group sharing one repository
    tests/torture/run --seed 7 --kill-points 1000 --daemons 3 --json out.json   # the long run
    tests/torture/run --soak --clients 64 --duration 600     # the soak: no faults, RSS and fds over time

A long run prints a progress line every --progress faults (kill points, faults, models checked,
violations). `kill -USR1 <pid>` ends its faults early and runs the finish (every model through every
daemon, the arena, fsck, clean exits), for a run that must stop before its target.

A run is reproducible from its seed up to thread scheduling: the same seed picks the same faults, in
the same order, with the same workers' operations. A failing run prints its seed; keep it in
tests/torture/test_torture.py as a regression case.
"""
import argparse
import json
import os
import random
import signal
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import faults  # noqa: E402
from cluster import Node, cairn, client_env, wait_group  # noqa: E402
from content import check_model, tensor_bytes  # noqa: E402
from oracle import Oracle  # noqa: E402

WORKER = Path(__file__).resolve().parent / "worker.py"
OPS = {"commit": 30, "meta": 4, "read": 22, "map": 12, "named": 10, "rm": 5, "gc": 1, "flush": 2, "hint": 6,
       "query": 4}


class Worker:
    def __init__(self, name, node, proc):
        self.name, self.node, self.proc = name, node, proc
        self.busy = {}  # thread -> (op, t) in flight
        self.reader = None


def summarize_stacks(text):
    """gdb's `thread apply all bt`, one line per kind of thread: its three innermost cairn functions
    (templates folded), with how many threads are in the same place."""
    counts = {}
    for block in text.split("\nThread ")[1:]:
        names = []
        for line in block.splitlines():
            m = re.match(r"#\d+\s+(?:0x[0-9a-f]+ in )?(.+?) \(", line)
            if not m or "cairn::" not in m.group(1):
                continue
            name = m.group(1)
            while re.search(r"<[^<>]*>", name):
                name = re.sub(r"<[^<>]*>", "", name)
            names.append(name.replace("(anonymous namespace)::", "").replace("cairn::", ""))
            if len(names) == 3:
                break
        key = " < ".join(names) or "(no cairn frame)"
        counts[key] = counts.get(key, 0) + 1
    return " | ".join(f"{k}" + (f" x{n}" if n > 1 else "") for k, n in sorted(counts.items()))[:4000]


class Run:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.root = Path(tempfile.mkdtemp(prefix="cairn-torture-", dir="/tmp"))
        self.repo = self.root / "repo"
        self.oracle = Oracle()
        self.faults_enabled = not args.no_fault_injection
        self.peer_timeout = 2.0
        self.nodes = [Node(self.root / f"n{i}", i, self.repo, args.daemons, args.dram, args.nvme,
                           f"{int(self.peer_timeout * 1000)}ms", args.watchdog, self.faults_enabled) for i in range(args.daemons)]
        self.workers = []
        self.worker_seq = 0
        self.kill_points = 0
        self.timeline = []  # (seconds since start, fault, description)
        self.samples = []  # (seconds, [rss per node], [fds per node])
        self.t0 = time.monotonic()
        self.bases = {}
        self.stop_sampling = threading.Event()
        self.stuck_seen = {}  # (node, start) -> watchdog reports already counted
        self.oldest_seen = 0.0  # the oldest request any daemon's watchdog saw at a check
        self.stop_faults = threading.Event()  # SIGUSR1: end the faults now, then the finish
        self.removed_refusals = []  # the first reads of removed models refused with an error: what they said

    # ---- helpers for faults ----
    def live_nodes(self):
        return [n for n in self.nodes if n.alive() and not n.stopped]

    def start_worker(self, node, hog=False):
        self.worker_seq += 1
        name = f"{'hog' if hog else 'w'}{self.worker_seq}"
        cfg = {"name": name, "socket": self.nodes[node].socket, "seed": self.args.seed, "bases": self.bases,
               "threads": 1 if hog else self.args.threads,
               "ops": {k: v for k, v in OPS.items() if not (self.args.no_gc and k == "gc")}, "hog": hog,
               "max_live": self.args.max_live, "pause": self.args.pause, "flat_lineage": self.args.soak}
        cfg_path = self.root / f"{name}.json"
        cfg_path.write_text(json.dumps(cfg))
        proc = subprocess.Popen([sys.executable, str(WORKER), str(cfg_path)], stdout=subprocess.PIPE,
                                stderr=open(self.root / f"{name}.err", "wb"), env=client_env())
        w = Worker(name, node, proc)
        w.reader = threading.Thread(target=self.read_events, args=(w,), daemon=True)
        w.reader.start()
        self.workers.append(w)
        return w

    def replace_worker(self, w):
        self.workers.remove(w)
        self.start_worker(w.node)

    def read_events(self, w):
        o = self.oracle
        # With --keep, every event of the worker is kept beside its config, stamped (a violation's
        # story: which operations on the model came before it).
        trail = open(self.root / f"{w.name}.events", "w") if self.args.keep else None
        for line in w.proc.stdout:
            if trail:
                text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
                trail.write(f"{time.strftime('%H:%M:%S')} {text.rstrip()}\n")
                trail.flush()
            try:
                e = json.loads(line)
            except ValueError:
                o.violation(f"worker {w.name} wrote garbage: {line[:200]!r}")
                continue
            ev = e["ev"]
            if ev == "op":
                w.busy[e["who"]] = (e["op"], e["t"])
            elif ev == "done":
                w.busy.pop(e["who"], None)
            elif ev == "intent":
                o.intent(e["id"], e["spec"], w.node, e.get("t"))
            elif ev == "ack":
                o.ack(e["id"], e["level"], e["t"])
            elif ev == "remove":
                o.remove(e["id"])
            elif ev == "unremove":
                o.unremove(e["id"])
            elif ev == "named":
                with o.mu:
                    o.named.setdefault(w.node, set()).add(e["key"])
            elif ev == "lost_memory":
                o.forget(e["id"])
            elif ev in ("violation", "crash"):
                o.violation(f"{e['who']}: {e.get('what') or e.get('msg')}")
            elif ev == "unexpected":
                o.violation(f"{e['who']}: {e['op']} failed unexpectedly: {e['status']}: {e['msg']}")
            elif ev == "error":
                o.count(f"error_{e['op']}_{e['status']}")
            elif ev in ("disconnected", "read", "full"):
                o.count(ev)

    # ---- the oracle's checks ----
    def check_node(self, n, limit=16, only_global=False, damaged=False):
        """Reads models through n and judges them (a sample of `limit`, or all with None). With
        `damaged` (bytes on disk are corrupted right now) an error is allowed, a wrong byte never."""
        group = len(self.nodes) > 1
        todo = [x for x in self.oracle.expected_on(n.index, group)
                if not only_global or self.oracle.acked.get(x[0], ("",))[0] == "global"]
        if limit is not None and len(todo) > limit:
            todo = self.rng.sample(todo, limit)
        for mid, spec, _acked in todo:
            t = time.monotonic()
            self.check_one(n, mid, spec, damaged)
            if self.args.verbose and time.monotonic() - t > 1:
                print(f"  slow check: {mid} through daemon {n.index}: {time.monotonic() - t:.1f} s "
                      f"(owner {self.oracle.owner.get(mid)}, {self.oracle.acked.get(mid)})", flush=True)

    def check_one(self, n, mid, spec, damaged=False):
        o = self.oracle
        for attempt in range(6):
            try:
                arrays = n.call(lambda c: c.load_model(mid, copy=True))
            except cairn.NotFound:
                if o.may_be_lost(mid):
                    if mid in o.acked and mid not in o.removed:
                        o.forget(mid)
                    return
                if attempt < 5 and o.owner.get(mid) != n.index:
                    time.sleep(0.3)  # another daemon's commit: seen after a refresh of the repository
                    continue
                level = o.acked.get(mid, ("?",))[0]
                o.violation(f"model {mid!r} acknowledged {level} on daemon {o.owner.get(mid)} is not found "
                            f"through daemon {n.index}")
                return
            except (cairn.CorruptData, cairn.IoError) as e:
                if damaged:
                    o.count("damaged_read_refused")
                    return
                if mid in o.removed:
                    # Removed by its client while this pass ran (its list is taken at the start, and
                    # a pass during a full arena takes minutes): a daemon whose view of the group
                    # still listed the model finds its chunks freed by a gc and refuses the read.
                    # An error, never wrong bytes. (Found by the peer-group run of seed 2712.)
                    o.count("removed_meanwhile_read_refused")
                    if len(self.removed_refusals) < 10:
                        self.removed_refusals.append(f"{mid} through daemon {n.index} (owner "
                                                     f"{o.owner.get(mid)}): {e.status}: {e}")
                    return
                o.violation(f"read of {mid!r} through daemon {n.index} failed: {e.status}: {e}")
                return
            except cairn.NoSpace:
                o.count("check_no_space")
                return
            wrong = check_model(arrays, spec)
            o.count("models_checked")
            if wrong:
                o.violation(f"read of {mid!r} through daemon {n.index} served wrong bytes: {wrong}")
            return

    def check_stuck(self):
        """The watchdog of the run: any operation of a worker older than the bound is a suspected
        deadlock; the daemons' own watchdogs report theirs in `cairn stats` and their logs."""
        now = time.monotonic()
        for w in self.workers:
            for who, (op, t) in list(w.busy.items()):
                if now - t > self.args.stuck_seconds and self.nodes[w.node].alive():
                    self.oracle.violation(f"{who}: `{op}` has run {now - t:.0f} s on daemon {w.node} "
                                          f"(deadlock?): log tail:\n{self.nodes[w.node].tail(20)}")
                    w.busy.pop(who, None)
        for n in self.live_nodes():
            wd = n.stats().get("watchdog")
            if wd is None:
                self.oracle.violation(f"daemon {n.index} has no watchdog in its stats")
            elif wd.get("stuck_reported", 0) > self.stuck_seen.get((n.index, n.starts), 0):
                self.stuck_seen[(n.index, n.starts)] = wd["stuck_reported"]  # counted anew by each start
                self.oracle.violation(f"daemon {n.index}'s watchdog reported stuck request(s) ({wd}): "
                                      f"{n.tail(80)}")
            elif wd.get("oldest_s", 0) > self.oldest_seen:
                self.oldest_seen = wd["oldest_s"]

    def sample(self):
        while not self.stop_sampling.wait(self.args.sample_seconds):
            self.samples.append((round(time.monotonic() - self.t0, 1), [n.rss_bytes() for n in self.nodes],
                                 [n.open_fds() for n in self.nodes]))

    # ---- the run ----
    def setup(self):
        for n in self.nodes:
            n.start()
        wait_group(self.nodes)
        c = self.nodes[0].client()
        for b in range(3):
            mid = f"base{b}"
            spec = {"tensors": {f"t{i}": [f"{mid}/t{i}", (1 << 20) + 4096 * i if i < 2 else 65536]
                                for i in range(4)}, "parent": None, "durability": "global"}
            c.save_model(mid, {k: tensor_bytes(*v) for k, v in spec["tensors"].items()}, durability="global",
                         wait=True)
            self.bases[mid] = spec
            self.oracle.intent(mid, spec, 0)
            self.oracle.ack(mid, "global", time.monotonic())
        for i in range(self.args.workers):
            self.start_worker(i % len(self.nodes))
        threading.Thread(target=self.sample, daemon=True).start()

    def fault_loop(self):
        weights = dict(faults.WEIGHTS)
        if len(self.nodes) < 2:
            weights.pop("sigstop_peer")
        for name in self.args.skip_fault + (["kill9_gc", "kill9_daemon_in_gc"] if self.args.no_gc else []):
            weights.pop(name, None)
        deadline = self.t0 + self.args.duration
        n_faults = 0
        while True:
            if self.args.max_faults:  # a regression case: exactly the first faults of its seed
                if n_faults >= self.args.max_faults:
                    break
            elif time.monotonic() >= deadline and self.kill_points >= self.args.kill_points:
                break
            if self.stop_faults.is_set():
                print(f"torture: SIGUSR1: faults ended at {self.kill_points} kill points, {n_faults} faults; "
                      "the finish runs", flush=True)
                break
            time.sleep(self.rng.random() * self.args.interval)
            name = self.rng.choices(list(weights), list(weights.values()))[0]
            t_fault = time.monotonic()
            try:
                what = faults.ALL[name](self)
            except Exception as e:  # a fault that cannot be carried out is the harness's failure
                self.oracle.violation(f"fault {name} failed: {type(e).__name__}: {e}")
                raise
            n_faults += 1
            self.oracle.count(f"fault_{name}")
            t_check = time.monotonic()
            for n in self.live_nodes():
                self.check_node(n, limit=None if n_faults % self.args.full_check_every == 0 else 12)
            self.check_stuck()
            self.timeline.append((round(t_fault - self.t0, 2), name, what,
                                  round(t_check - t_fault, 2), round(time.monotonic() - t_check, 2)))
            if self.args.verbose:
                print(f"[{self.timeline[-1][0]:8.2f}] {what} ({self.timeline[-1][3]:.2f} s; checked in "
                      f"{self.timeline[-1][4]:.2f} s)", flush=True)
            if self.args.progress and n_faults % self.args.progress == 0:
                c = self.oracle.counts
                print(f"progress: {time.monotonic() - self.t0:7.0f} s, {self.kill_points} kill points, {n_faults} "
                      f"faults, {c.get('models_checked', 0)} models checked, "
                      f"{c.get('removed_meanwhile_read_refused', 0)} reads of removed models refused, "
                      f"{len(self.oracle.violations)} violations", flush=True)
            if self.oracle.violations and self.args.stop_on_violation:
                break

    def soak_loop(self):
        deadline = self.t0 + self.args.duration
        while time.monotonic() < deadline:
            time.sleep(min(20, max(0.1, deadline - time.monotonic())))
            for n in self.live_nodes():
                try:
                    n.call(lambda c: c.gc())
                except cairn.Busy:  # a client's gc or the daemon's compaction is running: fine
                    self.oracle.count("soak_gc_busy")
                self.check_node(n, limit=24)
            self.check_stuck()

    def pin_evidence(self, n):
        """What a daemon that still holds arena space is doing: its peer-serving counters, and (where gdb
        is installed) the cairn frames of every thread, saved whole in the run's directory."""
        out = ""
        try:
            st = n.stats()
            out += "; leases: " + json.dumps(st.get("leases")) + "; watchdog: " + json.dumps(st.get("watchdog"))
        except Exception as e:  # evidence only: the violation is reported either way
            out += f"; stats: {e}"
        try:
            peers = n.cairn("peers", "--json")
            p = json.loads(peers.stdout) if peers.returncode == 0 else {}
            keys = ("sends_in_flight", "abandoned_sends", "late_bodies_drained", "timeouts")
            out += "; peers: " + json.dumps({k: p[k] for k in keys if k in p})
        except (ValueError, OSError, TypeError):
            pass
        gdb = shutil.which("gdb")
        if not gdb or not n.alive():
            return out
        try:
            r = subprocess.run([gdb, "-p", str(n.proc.pid), "-batch", "-ex", "thread apply all bt"],
                               capture_output=True, text=True, timeout=120)
        except (subprocess.TimeoutExpired, OSError) as e:
            return out + f"; gdb: {e}"
        path = n.root / "stacks.txt"
        path.write_text(r.stdout + r.stderr)
        return out + f"; thread stacks in {path}; threads (innermost cairn frames): " + summarize_stacks(r.stdout)

    def finish(self):
        """Every client gone; then: no leaked arena space, everything exact, fsck clean, clean exits."""
        self.stop_sampling.set()
        for w in self.workers:
            w.proc.kill()
            w.proc.wait()
        o = self.oracle
        report = {}
        for n in self.live_nodes():
            for key in sorted(o.named.get(n.index, ())):
                try:
                    n.call(lambda c: c.tensor_delete(key))
                except cairn.NotFound:
                    pass
            t = time.monotonic()
            n.call(lambda c: c.flush(timeout=300))
            o.flushed(n.index, t)
        for n in self.live_nodes():
            self.check_node(n, limit=None)
            listed = n.call(lambda c: c.list())
            for m in listed:
                mid = m["id"] if isinstance(m, dict) else m
                if mid not in o.specs and mid not in o.removed:
                    o.violation(f"daemon {n.index} lists {mid!r}, which no client committed")
        for n in self.live_nodes():
            # A daemon ends a dead client's session (and its leases) when the request it was serving
            # returns: a killed worker's gc may still wait behind the other members' gcs for the
            # repository's lease and the grace (the seed-4 case once found 4 MiB held 0.1 s before
            # such a gc returned). So first every request but this check's own must be done.
            settle_by = time.monotonic() + self.args.stuck_seconds
            while n.stats()["watchdog"]["in_flight"] > 1 and time.monotonic() < settle_by:
                time.sleep(0.2)
            deadline = time.monotonic() + 30
            while True:
                dram = n.stats()["tiers"]["dram"]
                leaked = dram["pinned_bytes"] + dram["used_bytes"] - dram["chunk_bytes"]
                if leaked == 0 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            report[f"daemon{n.index}_arena_after_clients"] = {k: dram[k] for k in
                                                             ("used_bytes", "chunk_bytes", "pinned_bytes")}
            if leaked:
                o.violation(f"daemon {n.index}: {leaked} bytes of arena space are still held with every client "
                            f"gone: {dram}{self.pin_evidence(n)}")
        fsck = self.nodes[0].call(lambda c: c.fsck(verify=True))
        report["fsck"] = fsck
        if not fsck.get("ok") or fsck.get("dangling"):
            o.violation(f"fsck is not clean: {json.dumps(fsck)[:600]}")
        self.check_stuck()
        for n in self.nodes:
            if n.alive():
                rc = n.term()
                if rc != 0:
                    o.violation(f"daemon {n.index} exited with {rc} on SIGTERM: {n.tail(30)}")
        return report

    def report(self, extra):
        s = self.oracle.summary()
        s.update(extra)
        s.update({
            "seed": self.args.seed, "daemons": len(self.nodes), "seconds": round(time.monotonic() - self.t0, 1),
            "kill_points": self.kill_points, "faults": len(self.timeline),
            "workers_started": self.worker_seq, "clients_at_once": self.args.workers * self.args.threads,
            "restarts": sum(n.starts - 1 for n in self.nodes), "samples": self.samples,
            "oldest_request_seen_s": self.oldest_seen,
            "removed_refusals": self.removed_refusals,
            "timeline": self.timeline if self.args.json else self.timeline[-20:],
        })
        s["flat"] = flatness(self.samples)
        return s


def flatness(samples):
    """RSS (RssAnon: the daemon's heap, not the arena) and descriptors of each daemon: the first quarter is warm-up; the mean of the last fifth
    against the mean of the second quarter (growth), and the largest descriptor count in each half."""
    if len(samples) < 8:
        return {}
    q = len(samples) // 4
    out = {}
    for i in range(len(samples[0][1])):
        mid = [s[1][i] for s in samples[q:2 * q]]
        end = [s[1][i] for s in samples[-max(1, len(samples) // 5):]]
        fds1 = max(s[2][i] for s in samples[q:len(samples) // 2])
        fds2 = max(s[2][i] for s in samples[len(samples) // 2:])
        growth = (sum(end) / len(end)) / max(1, sum(mid) / len(mid))
        out[f"daemon{i}"] = {"rss_anon_mib_second_quarter": round(sum(mid) / len(mid) / 2**20, 1),
                             "rss_anon_mib_last_fifth": round(sum(end) / len(end) / 2**20, 1),
                             "rss_growth": round(growth, 3), "fds_max_first_half": fds1, "fds_max_second_half": fds2}
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    p.add_argument("--duration", type=float, default=60, help="seconds of load (at least)")
    p.add_argument("--kill-points", type=int, default=0, help="go on until this many kill -9s were made")
    p.add_argument("--max-faults", type=int, default=0)
    p.add_argument("--daemons", type=int, default=1)
    p.add_argument("--workers", type=int, default=3, help="client processes")
    p.add_argument("--threads", type=int, default=2, help="clients (connections) per process")
    p.add_argument("--soak", action="store_true", help="no faults: a steady load, RSS and descriptors sampled")
    p.add_argument("--clients", type=int, default=0, help="soak: clients in all (processes x 8 threads)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between faults (random, up to)")
    p.add_argument("--dram", default="96MiB")
    p.add_argument("--nvme", default="256MiB")
    p.add_argument("--watchdog", default="30s", help="the daemons' request watchdog bound")
    p.add_argument("--stuck-seconds", type=float, default=240, help="a worker operation older is a deadlock")
    p.add_argument("--max-live", type=int, default=30, help="models each client keeps before removing")
    p.add_argument("--pause", type=float, default=0.0, help="seconds a client may pause between operations")
    p.add_argument("--full-check-every", type=int, default=25)
    p.add_argument("--sample-seconds", type=float, default=5)
    p.add_argument("--skip-fault", action="append", default=[], choices=sorted(faults.ALL))
    p.add_argument("--no-fault-injection", action="store_true", help="daemons without debug.fault_injection")
    p.add_argument("--no-gc", action="store_true",
                   help="no gc by clients and no gc faults (the suite's peer-group runs: gc in a group is an open bug, "
                        "docs/reliability.md)")
    p.add_argument("--stop-on-violation", action="store_true")
    p.add_argument("--progress", type=int, default=0, help="print a progress line every this many faults")
    p.add_argument("--json", help="write the whole report (timeline, samples) here")
    p.add_argument("--keep", action="store_true", help="keep the run's directory (logs, repository)")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    if args.soak:
        args.threads = 8
        args.workers = max(1, (args.clients or 64) // 8)
        args.max_live = min(args.max_live, 8)
        if args.dram == "96MiB":  # 64 clients' named tensors and views need more room than the faults' runs
            args.dram = "512MiB"
        if args.nvme == "256MiB":
            args.nvme = "1GiB"
    run = Run(args)
    signal.signal(signal.SIGUSR1, lambda *_: run.stop_faults.set())
    print(f"torture: seed {args.seed}, {args.daemons} daemon(s), {args.workers * args.threads} clients, "
          f"{'soak' if args.soak else 'faults'} for {args.duration:g} s"
          f"{f' and {args.kill_points} kill points' if args.kill_points else ''} (in {run.root})", flush=True)
    extra = {}
    try:
        run.setup()
        run.soak_loop() if args.soak else run.fault_loop()
        extra = run.finish()
    except Exception as e:
        run.oracle.violation(f"the run stopped: {type(e).__name__}: {e}")
        for n in run.nodes:
            if n.alive():
                n.kill9()
        for w in run.workers:
            w.proc.kill()
    rep = run.report(extra)
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=1))
    brief = {k: rep[k] for k in ("seconds", "kill_points", "faults", "restarts", "models_acknowledged",
                                 "acknowledged_by_level", "memory_models_lost_with_a_killed_daemon", "flat")}
    brief["checked"] = rep["counts"].get("models_checked", 0)
    print(json.dumps(brief, indent=1))
    if rep["violations"]:
        print(f"torture: FAILED (seed {args.seed}): {len(rep['violations'])} violation(s):", file=sys.stderr)
        for v in rep["violations"][:20]:
            print("  " + v, file=sys.stderr)
        print(f"  the run's directory (logs, repository): {run.root}", file=sys.stderr)
        return 1
    if not args.keep:
        shutil.rmtree(run.root, ignore_errors=True)
    print(f"torture: passed (seed {args.seed}): {rep['kill_points']} kill points, {rep['faults']} faults, "
          f"{brief['checked']} model reads checked, 0 acknowledged models lost or wrong")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
