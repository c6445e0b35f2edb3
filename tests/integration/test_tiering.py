"""The tiering engine against real cairnd processes: a working set larger than DRAM lives on the NVMe
tier, `local` commits survive kill -9, bad bytes on either tier are never served, and SIGTERM drains
the burst buffer to the repository."""
import json
import os
import signal
import time

import numpy as np

from stfiles import load_file, rand, save_file

MiB = 1 << 20


def nvme_config(root, capacity="512MiB", persistent=False, chunk="4MiB"):
    return (f"chunk_size: {chunk}\n"
            f"tiers:\n  nvme:\n    path: {root / 'nvme'}\n    capacity: {capacity}\n"
            f"    persistent: {'true' if persistent else 'false'}\n")


def tiered(make_daemon, tmp, name="d", dram="64MiB", **kw):
    """A daemon with DRAM `dram` and a burst buffer under its own directory."""
    d = make_daemon(name, dram=dram)
    root = tmp / name
    d.config.write_text(
        f"socket: {d.socket}\nrepository: {d.repo}\n" + nvme_config(root, **kw)
        + f"  dram:\n    capacity: {dram}\nlog:\n  level: warn\n  file: {root / 'cairnd.log'}\n")
    return d


def test_working_set_larger_than_dram(make_daemon, tmp):
    d = tiered(make_daemon, tmp).start()
    rng = np.random.default_rng(7)
    files = {}
    # 12 models of 24 MiB = 288 MiB through a 64 MiB arena, committed at `memory`.
    for i in range(12):
        f = tmp / f"m{i}.safetensors"
        save_file({"a": rand(rng, (1024, 1024 * 3), np.float32), "b": rand(rng, (1024, 1024 * 3), np.float32)}, str(f))
        files[f"m{i}"] = f
        d.cairn("put", f"m{i}", f, "--durability", "memory")
    s = d.stats()
    assert s["tiers"]["dram"]["used_bytes"] <= s["tiers"]["dram"]["capacity_bytes"] == 64 * MiB
    assert s["tiers"]["nvme"]["enabled"] and s["tiers"]["nvme"]["used_bytes"] > 64 * MiB
    # Every model reads back exact, most of them from NVMe or the repository.
    for mid, f in files.items():
        out = tmp / f"{mid}.out"
        d.cairn("get", mid, "-o", out)
        assert out.read_bytes() == f.read_bytes(), mid
    s = d.stats()
    assert s["tiers"]["dram"]["used_bytes"] <= 64 * MiB
    assert s["movement"]["reads_from_nvme"] > 0
    d.cairn("flush")
    s = d.stats()
    assert s["flush"]["pending_models"] == 0 and s["dirty_bytes"] == 0
    assert d.stop() == 0
    # Not persistent: the burst buffer's files are gone after a clean exit.
    assert not (tmp / "d" / "nvme" / "data").exists()


def test_local_commit_survives_kill9(make_daemon, tmp):
    d = tiered(make_daemon, tmp).start()
    rng = np.random.default_rng(8)
    files = {}
    for i in range(4):
        f = tmp / f"l{i}.safetensors"
        save_file({"w": rand(rng, (1024, 2048), np.float32), "shared": rand(np.random.default_rng(1), (256, 256), np.float32)}, str(f))
        files[f"l{i}"] = f
        d.cairn("put", f"l{i}", f, "--durability", "local", *(["--parent", f"l{i-1}"] if i else []))
    d.kill9()
    d.start()
    # Recovered from the burst buffer and written to the repository.
    d.cairn("flush")
    listed = [line.split()[0] for line in d.cairn("ls").stdout.splitlines() if line.strip()]
    assert sorted(listed) == ["l0", "l1", "l2", "l3"]
    assert all("global" in line for line in d.cairn("ls").stdout.splitlines() if line.strip())
    assert d.stats()["recovery"]["models_recovered"] >= 0
    for mid, f in files.items():
        out = tmp / f"{mid}.out"
        d.cairn("get", mid, "-o", out)
        assert out.read_bytes() == f.read_bytes(), mid
    lineage = json.loads(d.cairn("lineage", "l3", "--json").stdout)
    assert lineage["ancestors"] == ["l2", "l1", "l0"]
    assert d.cairn("fsck", "--json").returncode == 0
    assert d.stop() == 0


def test_flipped_byte_on_nvme_is_never_served(make_daemon, tmp):
    d = tiered(make_daemon, tmp, persistent=True).start()
    rng = np.random.default_rng(9)
    f = tmp / "x.safetensors"
    save_file({"w": rand(rng, (2048, 2048), np.float32)}, str(f))  # 16 MiB: 4 chunks of 4 MiB
    d.cairn("put", "x", f, "--durability", "local")
    d.cairn("flush")
    # Persistent: a clean exit keeps the burst buffer, so the restarted daemon reads from it.
    assert d.stop() == 0
    data = tmp / "d" / "nvme" / "data"
    assert data.exists()
    raw = bytearray(data.read_bytes()[: 64 * MiB])
    nz = [i for i in range(0, len(raw), 4096) if any(raw[i:i + 16])]
    assert nz, "the burst buffer holds the chunks"
    with open(data, "r+b") as fh:
        for off in nz[:: max(1, len(nz) // 8)]:
            fh.seek(off + 100)
            b = fh.read(1)
            fh.seek(off + 100)
            fh.write(bytes([b[0] ^ 0x40]))
    d.start()
    out = tmp / "x.out"
    d.cairn("get", "x", "-o", out)
    assert out.read_bytes() == f.read_bytes()
    s = d.stats()
    assert s["movement"]["nvme_copies_failed_check"] >= 1
    assert s["movement"]["reads_from_repository"] >= 1
    assert d.stop() == 0


def test_sigterm_drains_burst_buffer(make_daemon, tmp):
    d = tiered(make_daemon, tmp).start()
    rng = np.random.default_rng(10)
    files = {}
    for i in range(6):
        f = tmp / f"s{i}.safetensors"
        save_file({"w": rand(rng, (1024, 1024 * 2), np.float32)}, str(f))
        files[f"s{i}"] = f
        d.cairn("put", f"s{i}", f, "--durability", "memory")
    assert d.stop(signal.SIGTERM) == 0
    # The repository alone holds everything (the burst buffer was removed).
    assert not (tmp / "d" / "nvme" / "data").exists()
    d.config.write_text(d.config.read_text().replace("capacity: 512MiB", "capacity: 0"))
    d.start()
    for mid, f in files.items():
        out = tmp / f"{mid}.out"
        d.cairn("get", mid, "-o", out)
        assert out.read_bytes() == f.read_bytes()
    assert d.stop() == 0


def test_second_daemon_on_same_burst_buffer_is_refused(make_daemon, tmp):
    d = tiered(make_daemon, tmp).start()
    other = tiered(make_daemon, tmp, name="e")
    other.config.write_text(other.config.read_text().replace(str(tmp / "e" / "nvme"), str(tmp / "d" / "nvme")))
    try:
        other.start(timeout=10)
        assert False, "a second daemon started on the same burst buffer"
    except RuntimeError as e:
        assert "in use by another cairnd" in str(e)
    assert d.stop() == 0


def test_commit_blocks_only_for_memory_copy(make_daemon, tmp):
    """memory durability returns without waiting for the disks: many commits outrun the flusher, and
    the stats show the pipeline catching up afterwards (correctness only; no timing is asserted)."""
    d = tiered(make_daemon, tmp).start()
    rng = np.random.default_rng(11)
    f = tmp / "c.safetensors"
    for i in range(10):
        save_file({"w": rand(rng, (1024, 1024 * 2), np.float32)}, str(f))
        d.cairn("put", f"c{i}", f, "--durability", "memory")
    d.cairn("flush", "--timeout", "120")
    s = d.stats()
    assert s["flush"]["pending_models"] == 0
    assert s["repository"]["models"] == 10
    assert d.stop() == 0


def test_stats_say_what_backs_the_arena(daemon):
    # The arena's page backing is the kernel's shmem THP setting (docs/tiering.md, "Huge pages for
    # the arena"): the daemon reports it, and `cairn stats` prints it with the command that changes it.
    base = "/sys/kernel/mm/transparent_hugepage"
    mode = ""
    for f in (base + "/hugepages-2048kB/shmem_enabled", base + "/shmem_enabled"):
        try:
            word = open(f).read().split("[", 1)[1].split("]", 1)[0]
        except (OSError, IndexError):
            continue
        if word != "inherit":
            mode = word
            break
    pages = daemon.stats()["tiers"]["dram"]["pages"]
    if mode in ("always", "within_size", "advise", "force"):
        assert pages == f"2 MiB transparent huge pages (shmem_enabled: {mode})"
    else:
        assert pages.startswith("4 KiB pages")
        if mode:
            assert f"shmem_enabled: {mode}" in pages and "echo advise" in pages
    assert f"dram: {pages}" in daemon.cairn("stats").stdout
