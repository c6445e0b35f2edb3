"""Client.save_model with cairn.DeviceArray (tensors in device memory, cairn_model_add_tensor_device),
on the daemon's emulated HBM backend, where a process's "device memory" is its own memory
(docs/gpu.md); tests/python/test_torch_cuda.py runs the same path on a GPU."""
import numpy as np
import pytest

EMULATED = {"CAIRN_TIERS_HBM_CAPACITY": "8MiB", "CAIRN_TIERS_HBM_BACKEND": "emulated"}


def test_device_arrays_are_copied_before_save_returns(make_daemon):
    import cairn

    d = make_daemon(env=EMULATED)
    c = cairn.connect(d.socket)
    try:
        rng = np.random.default_rng(11)
        w = rng.standard_normal((300, 129)).astype(np.float32)
        raw = rng.integers(0, 2**16, 4097, dtype=np.uint16)  # bf16 bits
        small = np.arange(7, dtype=np.int64)
        want = {"w": w.copy(), "raw": raw.copy(), "small": small.copy(), "host": np.ones(5, np.float64)}
        t = c.save_model("dev/m", {"w": cairn.DeviceArray(w.ctypes.data, w.shape, "F32", owner=w),
                                   "raw": cairn.DeviceArray(raw.ctypes.data, raw.shape, "BF16", owner=raw),
                                   "small": cairn.DeviceArray(small.ctypes.data, small.shape, "I64", owner=small),
                                   "host": want["host"]},
                         durability="memory", pipelined=True)
        w[:] = 0  # the call has returned: the buffers are the caller's again
        raw[:] = 0
        small[:] = 0
        t.wait()
        info = {x["name"]: x for x in c.show("dev/m")["tensors"]}
        assert [x["name"] for x in c.show("dev/m")["tensors"]] == ["w", "raw", "small", "host"]
        assert info["raw"]["dtype"] == "BF16" and info["w"]["shape"] == [300, 129]
        got = c.load_model("dev/m", copy=True)
        for k, v in want.items():
            assert got[k].tobytes() == v.tobytes(), k
    finally:
        c.close()


def test_device_array_rejects_unknown_dtypes_and_needs_a_device_path(make_daemon):
    import cairn

    with pytest.raises(cairn.InvalidArgument, match="DeviceArray dtype 'F128'"):
        cairn.DeviceArray(0, (1,), "F128")
    d = make_daemon()  # no HBM tier, and no GPU in this process on a machine without one
    c = cairn.connect(d.socket)
    try:
        a = np.ones(1000, np.float32)
        # Without a GPU: no way to device memory at all. With one: host memory is not device memory.
        with pytest.raises((cairn.Unavailable, cairn.InvalidArgument), match="no HBM tier|not CUDA device memory"):
            c.save_model("dev/none", {"a": cairn.DeviceArray(a.ctypes.data, a.shape, "F32", owner=a)}, wait=True)
        with pytest.raises(cairn.NotFound):
            c.show("dev/none")  # nothing half-written
    finally:
        c.close()


def test_tensors_read_and_mapped_on_the_device_in_one_request(make_daemon):
    import ctypes

    import cairn
    from cairn import _args

    d = make_daemon(env=EMULATED)
    c = cairn.connect(d.socket)
    try:
        rng = np.random.default_rng(5)
        want = {f"t{i}": rng.integers(0, 255, 1000 + 4096 * i, dtype=np.uint8) for i in range(5)}
        c.save_model("dev/many", want, wait=True)
        lib = c._lib
        names = list(want)
        arr = (ctypes.c_char_p * len(names))(*[n.encode() for n in names])
        with c._conn.op() as h:
            r = ctypes.c_void_p()
            _args._check(lib.cairn_model_open(h, b"dev/many", ctypes.byref(r)))
            try:
                dst = {n: np.zeros_like(a) for n, a in want.items()}
                _args._check(lib.cairn_model_read_tensors_device(
                    r, len(names), arr, (ctypes.c_void_p * len(names))(*[dst[n].ctypes.data for n in names]),
                    (ctypes.c_size_t * len(names))(*[want[n].nbytes for n in names])))
                for n in names:
                    assert dst[n].tobytes() == want[n].tobytes(), n
                ptrs, sizes = (ctypes.c_void_p * len(names))(), (ctypes.c_size_t * len(names))()
                _args._check(lib.cairn_model_map_tensors_device(r, len(names), arr, -1, ptrs, sizes))
                for i, n in enumerate(names):
                    assert sizes[i] == want[n].nbytes
                    assert ctypes.string_at(ptrs[i], sizes[i]) == want[n].tobytes(), n
                assert c.stats()["tiers"]["hbm"]["devices"][0]["pinned_bytes"] == sum(a.nbytes for a in want.values())
                bad = (ctypes.c_size_t * len(names))(*[want[n].nbytes for n in names])
                bad[2] -= 1
                st = lib.cairn_model_read_tensors_device(
                    r, len(names), arr, (ctypes.c_void_p * len(names))(*[dst[n].ctypes.data for n in names]), bad)
                assert st != 0 and "t2" in str(cairn._errors.last_error(st))
            finally:
                lib.cairn_model_close(r)
        c.stats()
        assert c.stats()["tiers"]["hbm"]["devices"][0]["pinned_bytes"] == 0
    finally:
        c.close()
