"""Cycles found from reads, against real cairnd processes (docs/policy.md, "Cycles in the daemon"):
a model that does not fit in DRAM, read again and again a tensor at a time, keeps a stable part
resident with `policy.eviction: hints`, where LRU hits nothing."""
import numpy as np

from stfiles import rand, save_file

MiB = 1 << 20
TENSORS = 16  # of 512 KiB: an 8 MiB model, 4 chunks of 128 KiB per tensor, in a 4 MiB arena


def read_rounds(make_daemon, tmp, eviction, model_file, rounds=4):
    """The DRAM hits of each round of reading every tensor of `base`, one `cairn get` each, in a
    daemon started cold (the model stored by an earlier run of it); and its stats at the end."""
    # Stored through a DRAM tier that holds it (its writes are dirty until in the repository), then
    # read through one that holds half of it.
    d = make_daemon(eviction, dram="64MiB",
                    extra_config=f"chunk_size: 128KiB\npolicy:\n  eviction: {eviction}\n").start()
    d.cairn("put", "base", model_file)
    assert d.stop() == 0
    d.config.write_text(d.config.read_text().replace("capacity: 64MiB", "capacity: 4MiB"))
    d.start()
    assert d.stats()["tiers"]["dram"]["capacity_bytes"] == 4 * MiB
    out = tmp / f"{eviction}.out"
    hits = []
    for _ in range(rounds):
        before = d.stats()["tiers"]["dram"]["hits"]
        for i in range(TENSORS):
            d.cairn("get", "base", "--tensor", f"layer{i:02d}", "-o", out)
        hits.append(d.stats()["tiers"]["dram"]["hits"] - before)
    stats = d.stats()
    assert d.stop() == 0
    return hits, stats


def test_a_cycle_that_does_not_fit_keeps_a_stable_part_resident(make_daemon, tmp):
    rng = np.random.default_rng(11)
    f = tmp / "base.safetensors"
    save_file({f"layer{i:02d}": rand(rng, (128, 1024), np.float32) for i in range(TENSORS)}, str(f))
    lru, _ = read_rounds(make_daemon, tmp, "lru", f)
    hints, stats = read_rounds(make_daemon, tmp, "hints", f)
    print(f"DRAM hits per round: lru {lru}, hints {hints}")
    # Recency pushes each chunk out just before its next read.
    assert lru[1:] == [0, 0, 0]
    # Found at the first re-read; from then on the part resident then is hit on every round.
    assert stats["prefetch"]["cycles_found"] == 1
    assert stats["prefetch"]["cyclic_models"] == 1
    assert all(h >= 16 for h in hints[1:]), hints
    assert hints[2] == hints[3]
