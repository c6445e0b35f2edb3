"""The GPU tier with real daemons and real client processes (docs/gpu.md): the emulated device
backend everywhere, CUDA where a GPU is visible ("skipped: no GPU" otherwise). The C program
tests/c/hbm_test.c does the client side."""
import ctypes
import glob
import json
import subprocess
import time

import pytest

from conftest import BUILD, CAIRND

HBM_TEST = str(BUILD / "bin" / "hbm_test")
# The daemon fixture's config has its own tiers: section; the HBM keys come from the environment.
EMULATED = dict(extra_config="chunk_size: 64KiB\n",
                env={"CAIRN_TIERS_HBM_CAPACITY": "1MiB", "CAIRN_TIERS_HBM_BACKEND": "emulated"})


def gpu_count():
    # The driver first: it is wherever a GPU is, while the runtime may live inside a Python package.
    try:
        drv = ctypes.CDLL("libcuda.so.1")
        n = ctypes.c_int(0)
        if drv.cuInit(0) == 0 and drv.cuDeviceGetCount(ctypes.byref(n)) == 0:
            return n.value
        return 0
    except OSError:
        pass
    for name in ("libcudart.so", "libcudart.so.13", "libcudart.so.12"):
        try:
            rt = ctypes.CDLL(name)
        except OSError:
            continue
        n = ctypes.c_int(0)
        return n.value if rt.cudaGetDeviceCount(ctypes.byref(n)) == 0 else 0
    return 0


def hbm(daemon, *args, check=True, timeout=120):
    r = subprocess.run([HBM_TEST, *map(str, args)], env=daemon.env, capture_output=True, text=True, timeout=timeout)
    if check:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


def device_stats(daemon):
    return daemon.stats()["tiers"]["hbm"]["devices"][0]


def fingerprints(out):
    """{tensor: (host fnv, device fnv)} from hbm_test map/hold lines."""
    seen = {}
    for line in out.splitlines():
        if " host=" in line:
            name, host, dev, _ = line.split()
            seen[name] = (host.split("=")[1], dev.split("=")[1])
    return seen


def start_holder(daemon, model, *tensors):
    p = subprocess.Popen([HBM_TEST, "hold", model, "emulated", *tensors], env=daemon.env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    lines = []
    deadline = time.time() + 60
    while time.time() < deadline:
        line = p.stdout.readline()
        if not line:
            raise AssertionError("hbm_test hold ended: " + p.stderr.read())
        if line.strip() == "held":
            return p, fingerprints("".join(lines))
        lines.append(line)
    p.kill()
    raise AssertionError("hbm_test hold did not map in time")


def test_default_config_has_no_hbm_tier(daemon):
    hbm_tier = daemon.stats()["tiers"]["hbm"]
    assert hbm_tier["enabled"] is False
    assert "tiers.hbm.capacity is 0" in hbm_tier["why"]
    assert "hbm: no HBM tier: tiers.hbm.capacity is 0" in daemon.cairn("stats").stdout
    # Asking for device memory says why it cannot be had.
    r = hbm(daemon, "nohbm")
    assert "0 failed" in r.stdout
    r = daemon.cairn("prefetch", "plain", "--tier", "hbm", check=False)
    assert r.returncode != 0 and "no HBM tier" in r.stderr


def test_emulated_backend_suite(make_daemon):
    d = make_daemon(**EMULATED).start()
    r = hbm(d, "suite", "emulated")
    assert "0 failed" in r.stdout, r.stdout + r.stderr
    s = d.stats()["tiers"]["hbm"]
    assert s["enabled"] and s["backend"] == "emulated" and s["capacity_bytes"] == 1 << 20
    assert device_stats(d)["pinned_bytes"] == 0  # every reader closed: nothing held
    assert device_stats(d)["evictions"] >= 1


def test_two_processes_map_the_same_tensor_and_see_equal_bytes(make_daemon):
    d = make_daemon(**EMULATED).start()
    hbm(d, "put", "m", "a:300000:5", "b:1000:6")
    holder, held = start_holder(d, "m", "a")
    try:
        other = fingerprints(hbm(d, "map", "m", "a", "emulated").stdout)
        assert held["a"][0] == held["a"][1], "the holder's device bytes differ from the stored ones"
        assert other["a"] == held["a"], "two processes see different bytes on the device"
        dev = device_stats(d)
        assert dev["entries"] == 1 and dev["pinned_bytes"] == 300000
        s = d.stats()["tiers"]["hbm"]
        assert s["misses"] == 1 and s["hits"] >= 1  # promoted once, then shared
    finally:
        holder.kill()
        holder.wait()


def test_client_killed_with_device_leases_leaks_nothing(make_daemon):
    d = make_daemon(**EMULATED).start()
    hbm(d, "put", "big", "t0:409600:1", "t1:409600:2", "t2:409600:3")
    holder, _ = start_holder(d, "big", "t0", "t1")
    assert device_stats(d)["pinned_bytes"] == 2 * 409600
    r = hbm(d, "map", "big", "t2", "emulated", check=False)
    assert r.returncode != 0 and "held by device leases" in r.stderr
    holder.kill()  # SIGKILL: no close, no disconnect
    holder.wait()
    deadline = time.time() + 20
    while device_stats(d)["pinned_bytes"] and time.time() < deadline:
        time.sleep(0.05)
    assert device_stats(d)["pinned_bytes"] == 0
    # The capacity is back: the third tensor fits, by evicting what the dead client held.
    seen = fingerprints(hbm(d, "map", "big", "t2", "emulated").stdout)
    assert seen["t2"][0] == seen["t2"][1]
    assert device_stats(d)["evictions"] >= 1
    assert d.alive()


def test_prefetch_tier_hbm_promotes_and_reads_then_hit(make_daemon):
    d = make_daemon(**EMULATED).start()
    hbm(d, "put", "m", "a:200000:7", "b:3000:8")
    out = d.cairn("prefetch", "m", "--tier", "hbm").stdout
    assert "in HBM on device 0" in out
    s = d.stats()["tiers"]["hbm"]
    assert s["misses"] == 2 and s["chunks"] == 2 and s["used_bytes"] > 0
    assert device_stats(d)["pinned_bytes"] == 0  # staged, not leased
    seen = fingerprints(hbm(d, "map", "m", "a", "emulated").stdout)
    assert seen["a"][0] == seen["a"][1]
    s = d.stats()["tiers"]["hbm"]
    assert s["misses"] == 2 and s["hits"] >= 1
    r = d.cairn("prefetch", "m", "--tier", "hbm", "--device", "3", check=False)
    assert r.returncode != 0 and "tiers.hbm.devices" in r.stderr


def test_segments_go_with_the_daemon(make_daemon):
    d = make_daemon(**EMULATED).start()
    hbm(d, "put", "m", "a:100000:1")
    hbm(d, "map", "m", "a", "emulated")
    pid = d.proc.pid
    assert glob.glob(f"/dev/shm/cairn-hbm-{pid}-*")
    d.stop()
    assert not glob.glob(f"/dev/shm/cairn-hbm-{pid}-*")
    # A daemon killed with -9 cannot unlink its segments: the next one removes them.
    d2 = make_daemon("d2", **EMULATED).start()
    hbm(d2, "put", "m", "a:100000:1")
    hbm(d2, "map", "m", "a", "emulated")
    pid2 = d2.proc.pid
    d2.kill9()
    assert glob.glob(f"/dev/shm/cairn-hbm-{pid2}-*")
    make_daemon("d3", **EMULATED).start()
    assert not glob.glob(f"/dev/shm/cairn-hbm-{pid2}-*")


def test_bad_backend_and_missing_gpu_stop_the_daemon_with_why(make_daemon):
    d = make_daemon(env={"CAIRN_TIERS_HBM_CAPACITY": "1MiB", "CAIRN_TIERS_HBM_BACKEND": "opencl"})
    with pytest.raises(RuntimeError, match="HBM_BACKEND: .opencl. is not one of: cuda, emulated"):
        d.start()
    if gpu_count() == 0:
        d = make_daemon("nogpu", env={"CAIRN_TIERS_HBM_CAPACITY": "1MiB"})  # backend: cuda, the default
        with pytest.raises(RuntimeError, match="no GPU|without CUDA"):
            d.start()


def test_cuda_backend_suite(make_daemon):
    if gpu_count() == 0:
        pytest.skip("skipped: no GPU")
    d = make_daemon(extra_config="chunk_size: 64KiB\n",
                    env={"CAIRN_TIERS_HBM_CAPACITY": "1MiB", "CAIRN_TIERS_HBM_BACKEND": "cuda",
                         "CAIRN_TIERS_HBM_DEVICES": "0"}).start()
    r = hbm(d, "suite", "cuda")
    assert "0 failed" in r.stdout, r.stdout + r.stderr
    assert d.stats()["tiers"]["hbm"]["backend"] == "cuda"
