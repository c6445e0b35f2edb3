"""Filesystem faults injected into a real cairnd (debug.fault_injection, `cairn fault`): a client gets
a clear error naming the fault and never wrong bytes, acknowledged models are never lost, and the
request watchdog reports a stuck request with the daemon's thread stacks (docs/config.md, "Fault
injection" and "The request watchdog")."""
import json
import subprocess
import time

import numpy as np

from conftest import CAIRN
from stfiles import rand, save_file

FAULTS_ON = "debug:\n  fault_injection: true\n"


def model_file(tmp, name, seed, shape=(512, 512)):
    path = tmp / f"{name}.safetensors"
    rng = np.random.default_rng(seed)
    save_file({"w": rand(rng, shape, np.float32), "b": rand(rng, (shape[0],), np.float32)}, str(path))
    return path


def assert_reads_back(d, tmp, model_id, path):
    out = tmp / f"{model_id}-out.safetensors"
    d.cairn("get", model_id, "-o", out)
    assert out.read_bytes() == path.read_bytes()


def fault_list(d):
    return json.loads(d.cairn("fault", "list", "--json").stdout)


def restart(d):
    """A fresh arena: reads come from the repository again."""
    assert d.stop() == 0
    return d.start()


def test_enospc_on_pack_writes_fails_a_global_commit_then_it_succeeds_after_clear(make_daemon, tmp):
    d = make_daemon(extra_config=FAULTS_ON).start()
    assert "fault injection is enabled" in (d.root / "cairnd.log").read_text()
    f = model_file(tmp, "m", 1)
    d.cairn("fault", "add", "--op", "write", "--path", "/packs/", "--error", "ENOSPC", "--times", "-1")
    r = d.cairn("put", "m", f, check=False)
    assert r.returncode != 0
    assert "ENOSPC" in r.stderr and "no space" in r.stderr.lower(), r.stderr
    rules = fault_list(d)["rules"]
    assert len(rules) == 1 and rules[0]["injected"] >= 1 and rules[0]["error"] == "ENOSPC"
    # Not acknowledged, so not there: no half-stored model.
    assert d.cairn("get", "m", "-o", tmp / "x", check=False).returncode != 0
    assert d.stats()["fault_injection"]["injected"] >= 1

    d.cairn("fault", "clear")
    assert fault_list(d)["rules"] == []
    d.cairn("put", "m", f)
    assert_reads_back(d, tmp, "m", f)
    fsck = json.loads(d.cairn("fsck", "--json").stdout)
    assert fsck["ok"] and fsck["models"] == 1, fsck
    restart(d)
    assert_reads_back(d, tmp, "m", f)


def test_a_memory_commit_acknowledged_during_enospc_reaches_the_repository_after_clear(make_daemon, tmp):
    # Regression: the flusher dropped an acknowledged model whose repository write failed.
    d = make_daemon(extra_config=FAULTS_ON).start()
    f = model_file(tmp, "a", 2)
    d.cairn("fault", "add", "--op", "write", "--path", "/packs/", "--error", "ENOSPC", "--times", "-1")
    d.cairn("put", "a", f, "--durability", "memory")  # acknowledged at memory
    deadline = time.time() + 30
    while d.stats()["flush"]["repository_write_retries"] < 2 and time.time() < deadline:
        time.sleep(0.05)
    s = d.stats()
    assert s["flush"]["repository_write_retries"] >= 2 and s["pending_models"] == 1, s["flush"]
    assert_reads_back(d, tmp, "a", f)  # still served, from DRAM
    d.cairn("fault", "clear")
    d.cairn("flush", "--timeout", "60")
    assert d.stats()["pending_models"] == 0
    restart(d)
    assert_reads_back(d, tmp, "a", f)
    assert json.loads(d.cairn("fsck", "--json").stdout)["ok"]


def test_a_local_commit_acknowledged_during_enospc_survives_kill9(make_daemon, tmp):
    # Through the environment this time (the config's tiers section is the fixture's).
    env = {"CAIRN_DEBUG_FAULT_INJECTION": "1", "CAIRN_TIERS_NVME_PATH": str(tmp / "nvme"),
           "CAIRN_TIERS_NVME_CAPACITY": "256MiB"}
    d = make_daemon(env=env).start()
    f = model_file(tmp, "l", 3)
    d.cairn("fault", "add", "--op", "write", "--path", "/packs/", "--error", "EIO", "--times", "-1")
    d.cairn("put", "l", f, "--durability", "local")  # acknowledged: on the burst buffer
    deadline = time.time() + 30
    while d.stats()["flush"]["repository_write_retries"] < 1 and time.time() < deadline:
        time.sleep(0.05)
    assert d.stats()["flush"]["repository_write_retries"] >= 1
    d.kill9()
    d.start()  # the rules died with the daemon: recovery writes it to the repository
    d.cairn("flush", "--timeout", "60")
    assert d.stats()["recovery"]["models_recovered"] == 1
    assert_reads_back(d, tmp, "l", f)
    assert json.loads(d.cairn("fsck", "--json").stdout)["ok"]


def read_under_fault(make_daemon, tmp, name, seed, *rule):
    """Stores a model, restarts the daemon (reads now come from the repository), adds the rule and
    reads the model: returns the daemon, the model's file and the failed read's result."""
    d = make_daemon(extra_config=FAULTS_ON).start()
    f = model_file(tmp, name, seed)
    d.cairn("put", name, f)
    restart(d)
    d.cairn("fault", "add", *rule)
    out = tmp / f"{name}-bad.safetensors"
    r = d.cairn("get", name, "-o", out, check=False)
    assert r.returncode != 0
    assert not out.exists() or out.stat().st_size == 0  # nothing written, never wrong bytes
    return d, f, r


def test_eio_on_repository_reads_is_an_error_never_wrong_bytes(make_daemon, tmp):
    d, f, r = read_under_fault(make_daemon, tmp, "r", 4, "--op", "read", "--path", "/packs/", "--error", "EIO",
                               "--times", "-1")
    assert "EIO" in r.stderr and "input/output error" in r.stderr.lower(), r.stderr
    assert fault_list(d)["rules"][0]["injected"] >= 1
    d.cairn("fault", "clear")
    assert_reads_back(d, tmp, "r", f)


def test_a_bit_flipped_repository_read_is_caught_by_the_chunk_hash(make_daemon, tmp):
    d, f, r = read_under_fault(make_daemon, tmp, "b", 5, "--op", "read", "--path", "/packs/", "--effect", "flip_bit",
                               "--times", "1")
    # A flipped bit in a coded chunk's frame may fail its decoding before the hash is checked.
    assert "hash" in r.stderr or "do not decode" in r.stderr, r.stderr
    assert fault_list(d)["rules"][0]["injected"] == 1
    # The rule is spent: the same read now succeeds, exactly; the pack itself was never damaged.
    assert_reads_back(d, tmp, "b", f)
    assert json.loads(d.cairn("fsck", "--json").stdout)["ok"]


def test_fault_requests_are_refused_without_injection(daemon):
    for args in (["add", "--op", "write", "--path", "/packs/", "--error", "ENOSPC"], ["list"], ["clear"]):
        r = daemon.cairn("fault", *args, check=False)
        assert r.returncode != 0
        assert "debug.fault_injection" in r.stderr and "CAIRN_DEBUG_FAULT_INJECTION=1" in r.stderr, r.stderr
    assert daemon.stats()["fault_injection"] == {"enabled": False, "rules": 0, "injected": 0}


def test_bad_rules_are_refused_naming_the_field(make_daemon):
    d = make_daemon(extra_config=FAULTS_ON).start()
    cases = [
        (["--op", "scribble"], "rule.op"),
        (["--op", "write", "--error", "ENOPE"], "rule.error"),
        (["--op", "write", "--effect", "melt"], "rule.effect"),
        (["--op", "read", "--effect", "short_write"], "rule.effect"),
        (["--op", "sync", "--effect", "delay"], "rule.delay_ms"),
        (["--op", "write", "--times", "0"], "rule.times"),
        (["--op", "write", "--skip", "-1"], "rule.skip"),
    ]
    for args, field in cases:
        r = d.cairn("fault", "add", *args, check=False)
        assert r.returncode != 0 and field in r.stderr, (args, r.stderr)
    assert fault_list(d)["rules"] == []


def test_the_watchdog_reports_a_stuck_request_with_thread_stacks_once(make_daemon, tmp):
    d = make_daemon(extra_config=FAULTS_ON + "watchdog: 1s\n").start()
    f = model_file(tmp, "w", 6)
    # A global commit whose repository writes are slow waits for its durability: not reported.
    d.cairn("fault", "add", "--op", "write", "--path", "/packs/", "--effect", "delay", "--delay-ms", "1500")
    d.cairn("put", "w", f)
    d.cairn("ls")
    d.cairn("get", "w", "-o", tmp / "w1.safetensors")
    w = d.stats()["watchdog"]
    assert w["bound_s"] == 1.0 and w["stuck_reported"] == 0, w
    assert "watchdog:" not in (d.root / "cairnd.log").read_text()

    # fsck reading a pack that takes 2.5 s to read is stuck past the bound: reported, once.
    d.cairn("fault", "add", "--op", "read", "--path", "/packs/", "--effect", "delay", "--delay-ms", "2500")
    assert json.loads(d.cairn("fsck", "--json").stdout)["ok"]
    w = d.stats()["watchdog"]
    assert w["stuck_reported"] == 1 and w["stuck_now"] == 0 and w["oldest_s"] < 1.0, w
    log = (d.root / "cairnd.log").read_text()
    assert log.count("watchdog: request 'fsck'") == 1, log
    assert "client pid" in log and "past the watchdog bound of 1.00 s" in log
    stacks = log[log.index("the stacks of every thread of cairnd follow"):]
    assert stacks.count("thread ") >= 4, stacks          # the flusher's, the acceptor, the request's...
    assert "cairn::Repository::fsck" in stacks, stacks    # the stuck thread's frames, by name
    assert "cairn::Flusher::global_loop" in stacks
    assert "did not answer" not in stacks
    assert d.alive()
    assert_reads_back(d, tmp, "w", f)
    assert d.stats()["watchdog"]["stuck_reported"] == 1


def test_a_bit_flipped_burst_buffer_read_is_served_from_the_repository(make_daemon, tmp):
    # The injector sits under the burst buffer too.
    env = {"CAIRN_DEBUG_FAULT_INJECTION": "1", "CAIRN_TIERS_NVME_PATH": str(tmp / "nvme"),
           "CAIRN_TIERS_NVME_CAPACITY": "256MiB", "CAIRN_TIERS_NVME_PERSISTENT": "true"}
    d = make_daemon(env=env).start()
    f = model_file(tmp, "n", 7)
    d.cairn("put", "n", f, "--durability", "local")
    d.cairn("flush", "--timeout", "60")
    restart(d)  # DRAM is empty; the burst buffer still holds the chunks
    # Once: the burst buffer reads the chunk again and serves it (the copy may be a model's only one).
    d.cairn("fault", "add", "--op", "read", "--path", str(tmp / "nvme" / "data"), "--effect", "flip_bit")
    assert_reads_back(d, tmp, "n", f)
    assert fault_list(d)["rules"][0]["injected"] == 1
    moved = d.stats()["movement"]
    assert moved["nvme_copies_failed_check"] == 0 and moved["reads_from_repository"] == 0, moved
    d.cairn("fault", "clear")
    restart(d)
    # Every time: the copy fails its check, and the repository serves the chunk.
    d.cairn("fault", "add", "--op", "read", "--path", str(tmp / "nvme" / "data"), "--effect", "flip_bit",
            "--times", "-1")
    assert_reads_back(d, tmp, "n", f)
    moved = d.stats()["movement"]
    assert moved["nvme_copies_failed_check"] >= 1 and moved["reads_from_repository"] >= 1, moved


def test_gc_waiting_for_a_failing_flush_does_not_hold_off_commits_and_reads(make_daemon, tmp):
    d = make_daemon(extra_config=FAULTS_ON).start()
    f, g = model_file(tmp, "p", 8), model_file(tmp, "q", 9)
    d.cairn("fault", "add", "--op", "write", "--path", "/packs/", "--error", "ENOSPC", "--times", "-1")
    d.cairn("put", "p", f, "--durability", "memory")
    gc = subprocess.Popen([str(CAIRN), "gc"], env=d.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        assert gc.poll() is None  # waiting for p to reach the repository
        t0 = time.time()
        d.cairn("put", "q", g, "--durability", "memory", timeout=30)
        assert_reads_back(d, tmp, "p", f)
        assert time.time() - t0 < 20
        d.cairn("fault", "clear")
        out, err = gc.communicate(timeout=60)
        assert gc.returncode == 0, err
    finally:
        if gc.poll() is None:
            gc.kill()
            gc.wait()
    d.cairn("flush", "--timeout", "60")
    restart(d)
    assert_reads_back(d, tmp, "p", f)
    assert_reads_back(d, tmp, "q", g)
