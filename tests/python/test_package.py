"""The `cairn` Python package against real daemons: named tensors, models, zero-copy leases,
tickets, the catalog and errors."""
import gc
import json
import os
import pickle
import threading
import time

import numpy as np
import pytest

if os.environ.get("CAIRN_SANITIZED") == "1" and "libasan" not in os.environ.get("LD_PRELOAD", ""):
    # A sanitized libcairn.so loads only into a Python started with the sanitizer runtimes preloaded.
    pytest.skip("sanitized build: start this Python with LD_PRELOAD as in ctypes_env()", allow_module_level=True)

import cairn  # noqa: E402

ALL_DTYPES = list(cairn.DTYPES)
SHAPES = [(), (0,), (3, 0, 2), (5,), (17, 33), (70000,), (2, 3, 1, 2, 1, 2, 1, 2)]


def sample(rng, name, shape):
    """Random values of cairn dtype `name`, as the numpy type cairn returns it in."""
    dt = cairn.NUMPY_DTYPES[name]
    if name == "BOOL":
        return rng.integers(0, 2, shape).astype(bool)
    if dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, shape, dtype=dt, endpoint=True)


def override(name):
    """The dtype argument that stores raw bits as `name` (only needed where numpy lacks the type)."""
    return name if name in cairn.RAW_DTYPES else None


def same(got, want):
    assert got.dtype == want.dtype.newbyteorder("<") or got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape
    assert got.tobytes() == np.ascontiguousarray(want).astype(got.dtype).tobytes()


# ---- connecting ----

def test_connect_without_a_daemon_names_the_socket(tmp_path, monkeypatch):
    path = str(tmp_path / "nobody.sock")
    with pytest.raises(cairn.CairnError) as e:
        cairn.connect(path)
    assert isinstance(e.value, cairn.Unavailable)
    assert e.value.status == "CAIRN_ERR_UNAVAILABLE"
    assert path in e.value.message and path in str(e.value)

    # The default address is the C API's: $CAIRN_SOCKET, else ${XDG_RUNTIME_DIR:-/tmp}/cairn-$UID/cairnd.sock.
    monkeypatch.setenv("CAIRN_SOCKET", path)
    with pytest.raises(cairn.Unavailable, match=path):
        cairn.connect()
    monkeypatch.delenv("CAIRN_SOCKET")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    default = f"{tmp_path}/cairn-{os.getuid()}/cairnd.sock"
    with pytest.raises(cairn.Unavailable, match=default):
        cairn.connect()

    # An error crosses a process boundary whole (a process pool pickles a worker's exception).
    back = pickle.loads(pickle.dumps(e.value))
    assert type(back) is cairn.Unavailable
    assert (back.status, back.code, back.message) == (e.value.status, e.value.code, e.value.message)


def test_connect_uses_CAIRN_SOCKET(daemon, monkeypatch):
    monkeypatch.setenv("CAIRN_SOCKET", daemon.socket)
    with cairn.connect() as c:
        assert c.address == daemon.socket
        assert isinstance(c.list(), list)
    assert c.closed
    with pytest.raises(cairn.InvalidArgument, match="closed"):
        c.list()


# ---- named tensors ----

@pytest.mark.parametrize("name", ALL_DTYPES)
def test_named_tensor_roundtrip_every_dtype(client, name):
    rng = np.random.default_rng(ALL_DTYPES.index(name))
    for i, shape in enumerate(SHAPES):
        key = f"nt-{name}-{i}"
        a = sample(rng, name, shape)
        client.put_tensor(key, a, dtype=override(name))
        assert client.tensor_info(key) == (name, shape, a.nbytes)
        got = client.get_tensor(key)
        same(got, a)
        assert got.flags.writeable and got.flags.owndata
        client.tensor_delete(key)


def test_named_tensor_replace_and_delete(client):
    client.put_tensor("nt-r", np.arange(10, dtype=np.int64))
    client.put_tensor("nt-r", np.ones((2, 2), np.float16))
    same(client.get_tensor("nt-r"), np.ones((2, 2), np.float16))
    client.tensor_delete("nt-r")
    with pytest.raises(cairn.NotFound) as e:
        client.get_tensor("nt-r")
    assert e.value.status == "CAIRN_ERR_NOT_FOUND" and "nt-r" in e.value.message


def noncontiguous_cases():
    base = np.arange(4 * 6 * 5, dtype=np.float32).reshape(4, 6, 5)
    return {
        "transposed": base.transpose(2, 0, 1),
        "strided": base[:, ::2, 1:4],
        "reversed": base[::-1, :, ::-1],
        "fortran": np.asfortranarray(base),
        "big_endian": base.astype(">f4"),
        "broadcast": np.broadcast_to(np.arange(5, dtype=np.int16), (300, 5)),
        "0d_view": base[1, 2, 3:4].reshape(()),
        "large_strided": np.arange(300000, dtype=np.float64)[::3],  # > 64 KiB: through arena space
        "large_transposed": np.arange(300 * 200, dtype=np.float32).reshape(300, 200).T,
        "large_big_endian": np.arange(40000, dtype=">i4").reshape(200, 200),
        "large_broadcast": np.broadcast_to(np.arange(100, dtype=np.uint16), (1000, 100)),
        "list": [[1, 2, 3], [4, 5, 6]],
    }


def test_noncontiguous_inputs(client):
    cases = noncontiguous_cases()
    for label, a in cases.items():
        client.put_tensor(f"nc-{label}", a)
        want = np.asarray(a)
        got = client.get_tensor(f"nc-{label}")
        assert got.shape == want.shape and np.array_equal(got, want), label
        assert got.dtype == want.dtype.newbyteorder("=")
    client.save_model("nc-model", cases, wait=True)
    loaded = client.load_model("nc-model")
    for label, a in cases.items():
        assert np.array_equal(loaded[label], np.asarray(a)), label
    assert loaded["big_endian"].dtype == np.dtype("<f4")
    assert loaded["large_big_endian"].dtype == np.dtype("<i4")


def test_large_noncontiguous_arrays_are_copied_straight_into_arena_space(client, monkeypatch):
    """Over 64 KiB, a non-contiguous or big-endian array is not made contiguous in Python first:
    cairn_model_add_tensor_space hands out the arena space and np.copyto fills it."""
    prepared = []
    real = cairn._dtypes.prepare
    monkeypatch.setattr(cairn._dtypes, "prepare", lambda a, *args: prepared.append(np.asarray(a)) or real(a, *args))
    rng = np.random.default_rng(11)
    bits = rng.integers(0, 2**16, (400, 300), dtype=np.uint16)
    tensors = {
        "t": rng.standard_normal((300, 400)).astype(np.float32).T,
        "be": rng.standard_normal((100, 200)).astype(">f8")[::2],
        "bf16": bits[:, ::2],  # raw bits stored as BF16
        "small": np.arange(60, dtype=np.float32).reshape(6, 10).T,  # inline: made contiguous first
    }
    client.save_model("space-writes", tensors, dtypes={"bf16": "BF16"}, wait=True)
    assert len(prepared) == 1 and prepared[0].shape == (10, 6)
    loaded = client.load_model("space-writes", copy=True)
    for k, a in tensors.items():
        assert np.array_equal(loaded[k], a), k
    assert loaded["be"].dtype == np.dtype("<f8")
    assert [t["dtype"] for t in client.show("space-writes")["tensors"]] == ["F32", "F64", "BF16", "F32"]


def test_poll_tensor_with_a_timeout(client, daemon):
    t0 = time.monotonic()
    assert client.tensor_poll("poll-never", timeout=0.3) is False
    assert time.monotonic() - t0 >= 0.25
    assert client.tensor_poll("poll-never") is False  # timeout 0: do not wait

    def put_later():
        time.sleep(1.3)  # past the first 1 s slice of the wait
        with cairn.connect(daemon.socket) as other:
            other.put_tensor("poll-later", np.float32(1.5))

    th = threading.Thread(target=put_later)
    t0 = time.monotonic()
    th.start()
    try:
        assert client.tensor_poll("poll-later", timeout=30) is True
    finally:
        th.join()
    assert time.monotonic() - t0 < 20
    assert client.get_tensor("poll-later") == np.float32(1.5)
    assert client.tensor_poll("poll-later", timeout=None) is True


# ---- models ----

def every_dtype_tensors(rng):
    tensors, dtypes = {}, {}
    for name in ALL_DTYPES:
        for i, shape in enumerate(SHAPES):
            tensors[f"{name}.{i}"] = sample(rng, name, shape)
            if override(name):
                dtypes[f"{name}.{i}"] = name
    return tensors, dtypes


@pytest.mark.parametrize("copy", [False, True])
def test_model_roundtrip_every_dtype(client, copy):
    rng = np.random.default_rng(7)
    tensors, dtypes = every_dtype_tensors(rng)
    mid = f"all-dtypes-{copy}"
    t = client.save_model(mid, tensors, dtypes=dtypes, meta={"score": 0.5, "tags": ["x"]}, wait=True)
    assert t.done and t.reached == "global"
    loaded = client.load_model(mid, copy=copy)
    assert list(loaded) == list(tensors)  # the model's order
    for k, a in tensors.items():
        same(loaded[k], a)
        assert loaded[k].flags.writeable == copy
    shown = client.show(mid)
    assert [t["dtype"] for t in shown["tensors"]] == [k.split(".")[0] for k in tensors]
    assert shown["metadata"] == {"score": 0.5, "tags": ["x"]}


def test_load_model_names(client):
    client.save_model("names", {"a": np.arange(3), "b": np.ones(2), "c": np.zeros(1)}, wait=True)
    got = client.load_model("names", names=["c", "a"])
    assert list(got) == ["c", "a"]
    assert np.array_equal(got["a"], np.arange(3))
    del got
    gc.collect()
    with pytest.raises(cairn.NotFound, match="'zz'"):
        client.load_model("names", names=["a", "zz"])
    assert client._conn.open_readers == set()  # the failed load closed its reader


def test_zero_copy_views_are_read_only_and_shared(client):
    a = np.random.default_rng(1).standard_normal((256, 1024)).astype(np.float32)  # 1 MiB: one chunk
    client.save_model("zc", {"w": a}, wait=True)
    v1 = client.load_model("zc")["w"]
    v2 = client.load_model("zc")["w"]
    assert np.array_equal(v1, a)
    assert not v1.flags.writeable and not v1.flags.owndata
    with pytest.raises(ValueError):
        v1[0, 0] = 1.0
    with pytest.raises(ValueError):
        v1.flags.writeable = True
    # Both are views of the same bytes of the daemon's arena: no copy was made.
    assert v1.__array_interface__["data"][0] == v2.__array_interface__["data"][0]
    assert len(client._conn.open_readers) == 2
    # Views can be stored again as they are (their bytes are copied once, from the arena).
    client.save_model("zc-again", client.load_model("zc"), wait=True)
    assert np.array_equal(client.load_model("zc-again", copy=True)["w"], a)
    gc.collect()
    assert len(client._conn.open_readers) == 2
    del v1, v2
    gc.collect()
    assert client._conn.open_readers == set()


def test_zero_copy_lease_lives_exactly_as_long_as_the_arrays(make_daemon):
    d = make_daemon(dram="64MiB")
    rng = np.random.default_rng(2)
    big = rng.integers(0, 255, (40, 1024, 1024), dtype=np.uint8)
    filler = rng.integers(0, 255, (40, 1024, 1024), dtype=np.uint8)
    with cairn.connect(d.socket) as c:
        c.save_model("big", {"w": big, "small": np.arange(4)}, wait=True)
        arrays = c.load_model("big")
        view = arrays["w"][10:20]  # a view of a view still holds the lease
        small = arrays["small"]
        del arrays
        gc.collect()
        # `stats` counts what leases hold: a lease per tensor, a pin per chunk.
        chunks = sum(t["chunks"] for t in c.show("big")["tensors"])
        assert chunks >= 2 and c.stats()["leases"] == {"leases": 2, "chunk_pins": chunks, "owned_bytes": 0}
        # While "big" is leased it cannot be evicted: 40 MiB more do not fit in the 64 MiB arena.
        with pytest.raises(cairn.NoSpace) as e:
            c.put_tensor("filler", filler)
        assert e.value.status == "CAIRN_ERR_NO_SPACE" and "no space" in e.value.message
        assert np.array_equal(view, big[10:20])
        del view
        gc.collect()
        with pytest.raises(cairn.NoSpace):  # `small` comes from the same load: same lease
            c.put_tensor("filler", filler)
        del small
        gc.collect()
        c.put_tensor("filler", filler)  # the lease is gone: "big" was evicted to make room
        assert c._conn.open_readers == set()
        assert c.stats()["leases"] == {"leases": 0, "chunk_pins": 0, "owned_bytes": 0}
        c.tensor_delete("filler")

        # copy=True: owned arrays, nothing stays pinned.
        owned = c.load_model("big", copy=True)
        assert owned["w"].flags.writeable and owned["w"].flags.owndata
        owned["w"][0, 0, 0] ^= 1
        c.put_tensor("filler", filler)  # the copy's leases ended with the load
        c.tensor_delete("filler")
        assert np.array_equal(c.load_model("big", copy=True)["w"], big)  # the stored model is unchanged
        assert d.alive()


def test_close_waits_for_live_views(daemon):
    c = cairn.connect(daemon.socket)
    c.save_model("close-views", {"w": np.arange(100000, dtype=np.int32)}, wait=True)
    w = c.load_model("close-views")["w"]
    conn = c._conn
    c.close()
    assert c.closed
    with pytest.raises(cairn.InvalidArgument):
        c.load_model("close-views")
    assert conn.handle.value  # still connected: the arena stays mapped under `w`
    assert int(w[-1]) == 99999
    del w
    gc.collect()
    assert not conn.handle.value  # the last view is gone: disconnected


def test_release_from_another_thread_is_deferred(client):
    """A lease whose arrays die while another thread is inside a call is released when that call ends."""
    client.save_model("deferred", {"w": np.arange(10)}, wait=True)
    w = client.load_model("deferred")["w"]
    conn = client._conn
    inside, leave = threading.Event(), threading.Event()

    def hold():
        with conn.op():
            inside.set()
            leave.wait(30)

    th = threading.Thread(target=hold)
    th.start()
    try:
        assert inside.wait(30)
        del w
        gc.collect()
        assert len(conn.pending) == 1 and len(conn.open_readers) == 1
    finally:
        leave.set()
        th.join()
    assert not conn.pending and conn.open_readers == set()


def test_inherit_stores_only_the_changed_tensor(make_daemon):
    d = make_daemon()
    rng = np.random.default_rng(3)
    parent = {"a": rng.standard_normal((512, 512)).astype(np.float32),  # 1 MiB
              "b": rng.standard_normal((512, 512)).astype(np.float32),
              "c": rng.standard_normal((256, 256)).astype(np.float32)}  # 256 KiB
    new_c = rng.standard_normal((256, 256)).astype(np.float32)
    with cairn.connect(d.socket) as c:
        c.save_model("p", parent, meta={"score": 0.7}).wait()
        before = c.stats()["repository"]
        t = c.save_model("ch", {"c": new_c}, parent="p", inherit=["a", "b"], meta={"score": 0.8})
        assert t.wait(timeout=60) == "global"
        after = c.stats()["repository"]
        assert after["physical_bytes"] - before["physical_bytes"] == new_c.nbytes
        assert after["logical_bytes"] - before["logical_bytes"] == sum(a.nbytes for a in parent.values())
        child = c.load_model("ch")
        assert list(child) == ["c", "a", "b"]  # given tensors first, then the inherited ones
        assert np.array_equal(child["a"], parent["a"]) and np.array_equal(child["b"], parent["b"])
        assert np.array_equal(child["c"], new_c)
        shown = c.show("ch")
        assert shown["parent"] == "p" and shown["durability"] == "global"
        assert c.lineage("ch") == {"model": "ch", "ancestors": ["p"], "descendants": []}
        assert c.lineage("p")["descendants"] == ["ch"]
        assert c.query({"op": "ancestors", "model": "ch"}) == {"model": "ch", "ancestors": ["p"]}
        assert [m["id"] for m in c.list()] == ["p", "ch"]
        with pytest.raises(cairn.NotFound):  # not in the parent
            c.save_model("ch2", {}, parent="p", inherit=["zz"])
        with pytest.raises(cairn.InvalidArgument):  # no parent to inherit from
            c.save_model("ch3", {}, inherit=["a"])
        del child


def test_runs_of_plain_tensors_go_in_one_call_and_keep_the_order(make_daemon, monkeypatch):
    """Contiguous little-endian arrays between inherited or converted tensors are added by one
    cairn_model_add_tensors call per run (copied on every core); the model keeps the given order."""
    d = make_daemon()
    rng = np.random.default_rng(5)
    parent = {"p0": rng.standard_normal(70000).astype(np.float32), "p1": np.arange(8, dtype=np.int64)}
    child = {
        "a": rng.standard_normal((600, 500)).astype(np.float32),  # over a chunk's worth of runs
        "b": np.arange(10, dtype=np.int16),  # inline
        "t": rng.standard_normal((300, 400)).astype(np.float32).T,  # non-contiguous: arena space
        "c": rng.standard_normal(100000).astype(np.float64),
        "e": np.zeros(0, dtype=np.float32),  # empty
    }
    order = ["a", "b", "p0", "t", "c", "e", "p1"]
    with cairn.connect(d.socket) as c:
        c.save_model("par", parent, wait=True)
        calls = []
        lib = c._lib
        real = lib.cairn_model_add_tensors
        monkeypatch.setattr(lib, "cairn_model_add_tensors", lambda w, arr, n: calls.append(n) or real(w, arr, n))
        c.save_model("kid", child, parent="par", inherit=["p0", "p1"], order=order, wait=True)
        assert calls == [2, 2]  # [a, b], then p0 inherited, t converted, then [c, e]
        got = c.load_model("kid", copy=True)
        assert list(got) == order
        for k, a in {**child, **parent}.items():
            assert np.array_equal(got[k], a), k
        with pytest.raises(cairn.InvalidArgument, match="no parent"):  # a bad run adds nothing
            c.save_model("orphan", {"x": np.ones(100000, np.float32)}, inherit=["p0"])


def test_tickets(client):
    x = {"w": np.arange(200000, dtype=np.float32)}
    t = client.save_model("t-memory", x, durability="memory")  # pipelined: the reply is collected later
    assert t.reached == "sent" and not t.done
    assert np.array_equal(client.load_model("t-memory")["w"], x["w"])  # visible at once to this client
    assert t.wait() == "memory" and t.reached == "memory" and t.done

    t = client.save_model("t-global", x, parent="t-memory", inherit=[], durability="global")
    assert t.reached in ("memory", "global")
    assert t.wait(timeout=60) == "global" and t.reached == "global" and t.done
    assert t.wait() == "global"  # a finished ticket answers at once
    assert client.show("t-global")["durability"] == "global"

    t = client.save_model("t-local", x, durability="local")
    assert t.wait(timeout=60) == "local"
    assert client.show("t-local")["durability"] == "global"  # no NVMe tier yet: local means global

    # A ticket that times out can be waited for again. (Behind a 96 MiB flush, a 0 s wait almost
    # always times out; should the flush win the race, the wait simply succeeds.)
    client.save_model("t-big", {"w": np.random.default_rng(9).integers(0, 255, 96 << 20, dtype=np.uint8)})
    t = client.save_model("t-behind", x)
    try:
        t.wait(timeout=0)
    except cairn.Timeout as e:
        assert e.status == "CAIRN_ERR_TIMEOUT" and "global" in e.message and not t.done
    assert t.wait(timeout=120) == "global" and t.done

    t = client.save_model("t-wait", x, durability="global", wait=True)
    assert t.done and t.reached == "global"
    assert client.show("t-wait")["durability"] == "global"
    assert "t-memory" in [m["id"] for m in client.list()]
    gone = client.save_model("t-unwaited", x)
    del gone  # a ticket nobody waits for is freed; the model is still flushed
    gc.collect()


def test_pipelined_commits(client, daemon):
    """save_model at memory without wait is pipelined: many commits in flight, each outcome on its
    own ticket, in order (a child right after its parent sees it)."""
    client.save_model("pl-base", {"a": np.arange(10, dtype=np.int32), "b": np.ones(3)}, wait=True)
    tickets = []
    for i in range(300):
        parent = f"pl{i - 1}" if i else "pl-base"
        mid = f"pl{i}"
        if i == 100:
            mid = "pl-base"  # taken: AlreadyExists, on this ticket only
        if i == 101:
            parent = "pl99"
        if i == 150:
            parent = "pl-none"  # NotFound
        if i == 151:
            parent = "pl149"
        tickets.append(client.save_model(mid, {}, parent=parent, inherit_all=True, meta={"i": i},
                                         durability="memory"))
        assert client.pipeline_in_flight <= 256
    assert client.pipeline_in_flight > 0  # nothing waited for the replies yet
    for i, t in enumerate(tickets):
        if i == 100:
            with pytest.raises(cairn.AlreadyExists, match="pl-base"):
                t.wait()
            with pytest.raises(cairn.AlreadyExists):  # the same outcome again
                t.wait()
        elif i == 150:
            with pytest.raises(cairn.NotFound, match="pl-none"):
                t.wait()
        else:
            assert t.wait() == "memory", i
    assert client.pipeline_in_flight == 0
    import cairn as _c
    with _c.connect(daemon.socket) as other:
        m = other.load_model("pl299")
        assert np.array_equal(m["a"], np.arange(10, dtype=np.int32))
        assert other.show("pl299")["parent"] == "pl298"
        assert other.show("pl-base")["metadata"] == {}

    # A ticket dropped unwaited: its error comes from flush_pipeline, once.
    t = client.save_model("pl-base", {}, parent="pl-base", inherit_all=True, durability="memory")
    del t
    gc.collect()
    with pytest.raises(cairn.AlreadyExists):
        client.pipeline_flush()
    client.pipeline_flush()


def test_errors_carry_status_and_message(client):
    client.save_model("dup", {"w": np.zeros(3)}, wait=True)
    cases = [
        (lambda: client.get_tensor("no-such-key"), cairn.NotFound, "CAIRN_ERR_NOT_FOUND", "no-such-key"),
        (lambda: client.tensor_delete("no-such-key"), cairn.NotFound, "CAIRN_ERR_NOT_FOUND", "no-such-key"),
        (lambda: client.load_model("no-such-model"), cairn.NotFound, "CAIRN_ERR_NOT_FOUND", "no-such-model"),
        (lambda: client.show("no-such-model"), cairn.NotFound, "CAIRN_ERR_NOT_FOUND", "no-such-model"),
        (lambda: client.lineage("no-such-model"), cairn.NotFound, "CAIRN_ERR_NOT_FOUND", "no-such-model"),
        (lambda: client.save_model("dup", {"w": np.zeros(3)}), cairn.AlreadyExists, "CAIRN_ERR_EXISTS", "dup"),
        (lambda: client.save_model("x", {}, parent="no-such-parent"), cairn.NotFound, "CAIRN_ERR_NOT_FOUND",
         "no-such-parent"),
        (lambda: client.save_model("x", {"w": np.zeros(2)}, durability="eventually"), cairn.InvalidArgument,
         "CAIRN_ERR_INVALID_ARGUMENT", "eventually"),
        (lambda: client.save_model("x", {"w": np.zeros(2)}, meta={"a": {1, 2}}), cairn.InvalidArgument,
         "CAIRN_ERR_INVALID_ARGUMENT", "meta"),
        (lambda: client.save_model("x", {"w": np.zeros(2)}, arch={"layers": "nope"}), cairn.InvalidArgument,
         "CAIRN_ERR_INVALID_ARGUMENT", "layers"),
        (lambda: client.put_tensor("k", np.zeros(2, np.complex64)), cairn.InvalidArgument,
         "CAIRN_ERR_INVALID_ARGUMENT", "complex64"),
        (lambda: client.put_tensor("k", np.zeros(2, np.float32), dtype="BF16"), cairn.InvalidArgument,
         "CAIRN_ERR_INVALID_ARGUMENT", "BF16"),
        (lambda: client.put_tensor("k", np.zeros([1] * 9)), cairn.InvalidArgument, "CAIRN_ERR_INVALID_ARGUMENT",
         "9"),
        (lambda: client.put_tensor("", np.zeros(1)), cairn.InvalidArgument, "CAIRN_ERR_INVALID_ARGUMENT", ""),
        (lambda: client.put_tensor("a\0b", np.zeros(1)), cairn.InvalidArgument, "CAIRN_ERR_INVALID_ARGUMENT",
         "NUL"),
        (lambda: client.query({"op": "siblings"}), cairn.InvalidArgument, "CAIRN_ERR_INVALID_ARGUMENT", "siblings"),
        (lambda: client.tensor_poll("k", timeout=-1), cairn.InvalidArgument, "CAIRN_ERR_INVALID_ARGUMENT", "timeout"),
    ]
    for call, cls, status, needle in cases:
        with pytest.raises(cls) as e:
            call()
        err = e.value
        assert isinstance(err, cairn.CairnError)
        assert err.status == status, (status, err)
        assert err.code == cairn.CairnError(status, "").code > 0
        assert err.message and str(err) == err.message
        assert needle in err.message, (needle, err.message)
    # A failed commit stores nothing.
    assert "x" not in [m["id"] for m in client.list()]
    assert isinstance(cairn.NotFound("CAIRN_ERR_NOT_FOUND", "m"), LookupError)
    assert isinstance(cairn.InvalidArgument("CAIRN_ERR_INVALID_ARGUMENT", "m"), ValueError)


def test_every_status_of_the_library_has_its_exception_class():
    """The status table comes from the loaded library (cairn_status_name, made from status_codes.h):
    a status appended there without a Python class fails here."""
    from cairn import _errors, _ffi

    names = _ffi.status_names()
    assert names[0] == "CAIRN_OK" and "CAIRN_ERR_NOT_FOUND" in names
    assert _ffi.library().cairn_status_name(len(names)) is None
    for code, name in enumerate(names[1:], start=1):
        err = _errors.make_error(code, "m")
        assert err.status == name and err.code == code
        assert type(err) is not cairn.CairnError, f"{name} has no exception class in cairn._errors"
    assert _errors.status_name(len(names) + 5) == f"CAIRN_STATUS_{len(names) + 5}"


def test_model_reader_reads_every_way(client):
    rng = np.random.default_rng(3)
    want = {"a": rng.standard_normal((64, 33)).astype(np.float32), "b": np.arange(10, dtype=np.int64),
            "e": np.zeros((0, 4), np.float16)}
    client.save_model("reader-m", want, wait=True)
    with client.model_open("reader-m") as r:
        assert [(n, d, s, b) for n, d, s, b in r.tensors] == [
            ("a", "F32", (64, 33), 64 * 33 * 4), ("b", "I64", (10,), 80), ("e", "F16", (0, 4), 0)]
        assert r.info("b")[3] == 80
        with pytest.raises(cairn.NotFound, match="reader-m.*'nope'"):
            r.info("nope")
        views = r.map(["b", "a"])
        assert list(views) == ["b", "a"] and not views["a"].flags.writeable
        same(views["a"], want["a"])
        copies = r.read()
        assert all(c.flags.writeable for c in copies.values())
        same(copies["e"], want["e"])
        dst = np.empty(10, np.int64)
        r.read_into({"b": dst})
        same(dst, want["b"])
        with pytest.raises(cairn.InvalidArgument, match="80 bytes, the array 72"):
            r.read_into({"b": np.empty(9, np.int64)})
        cow = r.map(["a"], writable=True)["a"]
        cow[0, 0] = 123.0
    # Views outlive the reader; the stored model never changes through a copy-on-write view.
    same(views["b"], want["b"])
    same(client.load_model("reader-m", copy=True)["a"], want["a"])
    with pytest.raises(cairn.InvalidArgument, match="closed"):
        r.read()
    del views, cow
    gc.collect()
    with pytest.raises(cairn.NotFound, match="no-such"):
        client.model_open("no-such")
    assert isinstance(cairn.library_has_cuda(), bool)


def test_safetensors_files_through_the_library(client, tmp_path):
    from safetensors.numpy import save_file

    src = tmp_path / "m.safetensors"
    save_file({"w": np.arange(12, dtype=np.float32).reshape(3, 4)}, str(src), metadata={"k": "v"})
    client.model_put_file("file-m", src, durability="memory", meta={"from": "file"})
    assert client.show("file-m")["metadata"] == {"from": "file"}
    out = tmp_path / "back.safetensors"
    client.model_get_file("file-m", out)
    assert out.read_bytes() == src.read_bytes()
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\xff" * 16)
    with pytest.raises(cairn.InvalidArgument, match="bad.safetensors"):
        client.model_put_file("file-bad", bad)
    assert "file-bad" not in [m["id"] for m in client.list()]


def test_inherit_all(make_daemon):
    d = make_daemon()
    rng = np.random.default_rng(4)
    parent = {"a": rng.standard_normal((512, 512)).astype(np.float32),
              "b": rng.standard_normal((256, 256)).astype(np.float32),
              "c": np.arange(10, dtype=np.int64)}
    with cairn.connect(d.socket) as c:
        c.save_model("ia-p", parent, meta={"score": 0.5}, wait=True)
        before = c.stats()["repository"]
        # A metadata-only commit: every tensor inherited, no bytes stored.
        c.save_model("ia-meta", {}, parent="ia-p", inherit_all=True, meta={"score": 0.6}, wait=True)
        after = c.stats()["repository"]
        assert after["physical_bytes"] == before["physical_bytes"]
        assert after["logical_bytes"] - before["logical_bytes"] == sum(a.nbytes for a in parent.values())
        got = c.load_model("ia-meta")
        assert list(got) == ["a", "b", "c"]
        assert all(np.array_equal(got[k], parent[k]) for k in parent)
        assert c.show("ia-meta")["metadata"] == {"score": 0.6}
        del got
        # Given tensors first, then those inherited by name, then the parent's others in its order.
        new_b = np.ones((256, 256), np.float32)
        c.save_model("ia-mixed", {"b": new_b}, parent="ia-p", inherit=["c"], inherit_all=True, wait=True)
        got = c.load_model("ia-mixed", copy=True)
        assert list(got) == ["b", "c", "a"]
        assert np.array_equal(got["b"], new_b) and np.array_equal(got["a"], parent["a"])
        with pytest.raises(cairn.InvalidArgument, match="parent"):
            c.save_model("ia-orphan", {}, inherit_all=True)
        assert "ia-orphan" not in [m["id"] for m in c.list()]


def test_gc_and_fsck(make_daemon):
    d = make_daemon()
    with cairn.connect(d.socket) as c:
        c.save_model("gc-keep", {"w": np.arange(100000, dtype=np.float32)}, wait=True)
        c.save_model("gc-drop", {"w": np.ones(100000, np.float32)}, wait=True)
        physical = c.stats()["repository"]["physical_bytes"]
        c.remove("gc-drop")
        out = c.gc()
        # Retired without descendants: deleted (`removed`); `collected` would keep its lineage.
        assert out["removed"] == ["gc-drop"] and out["collected"] == []
        assert out["physical_bytes"] < physical
        with pytest.raises(cairn.NotFound):
            c.load_model("gc-drop")
        report = c.fsck()
        assert report["ok"] is True and report["dangling"] == [] and report["bytes_verified"] > 0
        quick = c.fsck(verify=False)
        assert quick["ok"] is True
        assert np.array_equal(c.load_model("gc-keep", copy=True)["w"], np.arange(100000, dtype=np.float32))


def test_catalog_goes_through_the_library(client):
    """list/show/stats/remove use cairn_request on the client's own connection: no second socket."""
    assert not hasattr(client._conn, "wire")
    assert not hasattr(cairn, "_wire")
    assert client.stats()["chunk_size"] > 0
    with pytest.raises(cairn.InvalidArgument, match="cairn_model_add_tensor_space"):
        client._request({"op": "allocate", "nbytes": 8})
    with pytest.raises(cairn.InvalidArgument, match="cairn_connect"):
        client._request({"op": "hello"})


def test_remove(client):
    client.save_model("rm-me", {"w": np.zeros(3)}, wait=True)
    assert "rm-me" in [m["id"] for m in client.list()]
    client.remove("rm-me")
    assert "rm-me" not in [m["id"] for m in client.list()]
    with pytest.raises(cairn.NotFound):
        client.remove("never-stored")


# ---- best ancestor (the daemon side is the catalog issue) ----

def graph(head_out):
    return {
        "layers": [
            {"name": "stem", "type": "Conv2d", "config": {"in_channels": 3, "out_channels": 8, "kernel_size": 3}},
            {"name": "relu", "type": "ReLU", "inputs": ["stem"]},
            {"name": "fc", "type": "Linear", "config": {"in_features": 8, "out_features": head_out},
             "inputs": ["relu"]},
        ],
    }


def test_best_ancestor(client):
    rng = np.random.default_rng(5)
    tensors = {"stem.weight": rng.standard_normal((8, 3, 3, 3)).astype(np.float32),
               "fc.weight": rng.standard_normal((10, 8)).astype(np.float32)}
    client.save_model("ba-a", tensors, arch=graph(10), meta={"score": 0.9}, wait=True)
    client.save_model("ba-b", {"x": np.zeros(3)}, meta={"score": 0.99}, wait=True)
    try:
        answer = client.best_ancestor(graph(100))
    except cairn.InvalidArgument as e:
        if "not supported" in e.message:
            pytest.skip(f"this cairnd has no best_ancestor query yet: {e.message}")
        raise
    assert "ba-a" in json.dumps(answer), answer
    answer = client.best_ancestor(graph(100), where={"score": {">=": 0.5}})
    assert "ba-a" in json.dumps(answer), answer
    answer = client.best_ancestor(graph(100), where={"score": {">": 0.95}})  # filters ba-a out
    assert "ba-a" not in json.dumps(answer), answer


def test_one_client_shared_by_threads(client):
    """Calls from several threads are serialised; leases dropped on any thread are all released."""
    client.save_model("threads", {"w": np.arange(50000, dtype=np.int64), "b": np.ones(3)}, wait=True)
    errors = []

    def work(seed):
        try:
            rng = np.random.default_rng(seed)
            kept = []
            for i in range(40):
                m = client.load_model("threads", copy=bool(i % 3 == 0))
                assert int(m["w"][-1]) == 49999
                kept.append(m["w"][int(rng.integers(0, 100)):])
                if len(kept) > 3:
                    kept.pop(int(rng.integers(0, len(kept))))
                client.put_tensor(f"threads-{seed}", m["b"])
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    gc.collect()
    client.list()  # any release still deferred is done by the next call
    assert not client._conn.pending and client._conn.open_readers == set()


def test_local_durability_and_flush(make_daemon, tmp_path):
    """With a burst buffer, a `local` ticket reaches at least "local"; flush() waits for the
    repository and stats() says nothing is left on its way."""
    nvme = tmp_path / "nvme"
    d = make_daemon(env={"CAIRN_TIERS_NVME_CAPACITY": "256MiB", "CAIRN_TIERS_NVME_PATH": str(nvme)})
    with cairn.connect(d.socket) as c:
        w = np.random.default_rng(3).standard_normal((512, 1024)).astype(np.float32)
        t = c.save_model("loc", {"w": w}, durability="local")
        assert t.wait() in ("local", "global")
        assert c.stats()["tiers"]["nvme"]["enabled"] is True
        out = c.flush(timeout=60)
        assert out["pending_models"] == 0 and out["dirty_bytes"] == 0
        s = c.stats()
        assert s["flush"]["pending_models"] == 0 and s["repository"]["models"] == 1
        assert np.array_equal(c.load_model("loc", copy=True)["w"], w)


def test_hints(client):
    """Client.hint: unknown models are listed, not an error; a malformed hint names its field; the
    hinted model reads back exactly."""
    w = np.arange(1 << 16, dtype=np.float32)
    client.save_model("hinted", {"w": w}, wait=True)
    r = client.hint("will_load", ["hinted", "never-stored"], when="next")
    assert r["kind"] == "will_load" and r["models"] == 1 and r["unknown"] == ["never-stored"]
    assert client.hint("sequence", ["hinted"], ahead=1)["queued"] == 1
    assert client.hint("population", "hinted")["models"] == 1  # one id as a plain string
    client.hint("done", ["hinted"])
    with pytest.raises(cairn.InvalidArgument, match="hint.kind"):
        client.hint("maybe", ["hinted"])
    with pytest.raises(cairn.InvalidArgument, match="hint.ahead"):
        client.hint("sequence", ["hinted"], ahead=0)
    with pytest.raises(cairn.InvalidArgument, match="hint.when"):
        client.hint("will_load", ["hinted"], when="tomorrow")
    assert np.array_equal(client.load_model("hinted", copy=True)["w"], w)
    assert client.stats()["prefetch"]["hints"] >= 4


def test_the_package_version_is_the_project_version():
    """pip's metadata (api/python/pyproject.toml) carries CMake's project version, which the
    installed package's dist-info, the programs' --version and libcairn's soname take."""
    import re
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    project = re.search(r"project\(cairn\s+VERSION\s+([0-9.]+)", (root / "CMakeLists.txt").read_text())
    assert project, "no project(cairn VERSION ...) in CMakeLists.txt"
    pyproject = tomllib.loads((root / "api" / "python" / "pyproject.toml").read_text())["project"]["version"]
    assert pyproject == project.group(1)
