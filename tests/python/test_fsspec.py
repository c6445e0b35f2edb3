"""cairn.fsspec: the cairn:// filesystem against a real daemon.

fsspec's own abstract test suite (fsspec.tests.abstract, unchanged) runs first, then round trips,
deduplication, the semantics of versions, foreign models, errors, the entry point in a fresh
interpreter, and a Lightning Trainer whose default_root_dir is cairn://.
"""
import hashlib
import importlib.metadata
import io
import json
import os
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path

import fsspec
import numpy as np
import pytest
from fsspec.tests.abstract import (AbstractCopyTests, AbstractFixtures, AbstractGetTests, AbstractOpenTests,
                                   AbstractPipeTests, AbstractPutTests)

import cairn
from cairn.fsspec import (_FILE_ARCH, AVG_PIECE, MAX_PIECE, MIN_PIECE, RECORD_KEY, CairnFileSystem, content_cuts,
                          file_segments)

from conftest import ROOT


def new_fs(daemon, **options):
    return CairnFileSystem(socket=daemon.socket, skip_instance_cache=True, **options)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def physical_bytes(client) -> int:
    """Bytes of the distinct chunks the repository holds (`cairn stats`: repository.physical_bytes),
    once every model committed so far is in it."""
    client.flush()
    return client.stats()["repository"]["physical_bytes"]


# ---- fsspec's abstract tests, unchanged, on a live daemon ----

class CairnFixtures(AbstractFixtures):
    """The fixtures fsspec's abstract tests need: a filesystem on the module's daemon (durability
    "memory": these tests check semantics, not durability), a fresh root per test, no empty
    directories (they exist only while files are below them)."""

    @pytest.fixture(scope="class")
    @classmethod
    def fs(cls, daemon):
        return new_fs(daemon, durability="memory")

    @pytest.fixture
    def fs_path(self):
        return unique("abstract")

    @pytest.fixture
    def fs_join(self):
        return lambda *parts: "/".join(parts)

    @pytest.fixture
    def supports_empty_directories(self):
        return False


class TestCairnCopy(CairnFixtures, AbstractCopyTests):
    pass


class TestCairnGet(CairnFixtures, AbstractGetTests):
    pass


class TestCairnPut(CairnFixtures, AbstractPutTests):
    pass


class TestCairnPipe(CairnFixtures, AbstractPipeTests):
    pass


class TestCairnOpen(CairnFixtures, AbstractOpenTests):
    pass


# ---- chunking ----

def test_content_cuts_respect_sizes_and_resynchronise_after_an_insertion():
    data = np.random.default_rng(1).integers(0, 256, 24 << 20, dtype=np.uint8)
    cuts = content_cuts(data)
    assert cuts[-1] == len(data)
    sizes = np.diff([0] + cuts)
    assert (sizes[:-1] >= MIN_PIECE).all() and (sizes <= MAX_PIECE).all()
    assert 0.8 * AVG_PIECE < sizes.mean() < 1.5 * AVG_PIECE
    shifted = np.concatenate([data[:1000], np.frombuffer(b"inserted!" * 11, np.uint8), data[1000:]])
    after = content_cuts(shifted)
    # Past the first pieces, every cut is the same content boundary, 99 bytes later.
    assert [c + 99 for c in cuts[2:]] == after[2:]
    # A cut depends on the bytes up to MAX_PIECE after the previous one, not on what follows.
    head = 10 << 20
    assert ([c for c in content_cuts(data[:head]) if c <= head - MAX_PIECE] ==
            [c for c in cuts if c <= head - MAX_PIECE])


def test_content_cuts_of_constant_bytes_are_max_size_pieces():
    assert content_cuts(bytes(20 << 20)) == list(range(MAX_PIECE, 20 << 20, MAX_PIECE)) + [20 << 20]
    assert content_cuts(b"") == []
    assert content_cuts(b"abc") == [3]


def test_file_segments_of_a_torch_archive_are_its_storage_records():
    torch = pytest.importorskip("torch")
    sd = {"a": torch.randn(300, 300), "b": torch.arange(1000), "c": torch.zeros(0)}
    buf = io.BytesIO()
    torch.save(sd, buf)
    data = buf.getvalue()
    layout, segments = file_segments(data)
    assert layout == "torch-zip"
    assert segments[0][1] == 0 and segments[-1][2] == len(data)
    assert all(a[2] == b[1] for a, b in zip(segments, segments[1:]))
    records = {name.split("=", 1)[1]: data[s:e] for name, s, e in segments if "=" in name}
    # The non-empty storages, byte for byte as numpy (and cairn.torch.save) stores them.
    assert sorted(records) == ["archive/data/0", "archive/data/1"]
    assert set(records.values()) == {sd["a"].numpy().tobytes(), sd["b"].numpy().tobytes()}
    assert file_segments(b"PK\x03\x04 but not a zip")[0] == "content-defined"


# ---- round trips ----

@pytest.mark.parametrize("size", [0, 1, 31, 32, 4096, MIN_PIECE + 1, 9 << 20])
def test_random_bytes_round_trip(daemon, size):
    fs = new_fs(daemon, durability="memory")
    path = unique("rt") + "/blob.bin"
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    with fs.open(path, "wb") as f:
        for i in range(0, size, 1 << 20):
            f.write(data[i:i + (1 << 20)])
    assert fs.info(path)["size"] == size
    assert fs.cat_file(path) == data
    with fs.open(path, "rb") as f:
        assert f.read() == data
    record = fs.client.show(fs.info(path)["model"])["metadata"][RECORD_KEY]
    assert record["size"] == size and record["sha256"] == hashlib.sha256(data).hexdigest()


def test_a_long_read_is_copied_piece_by_piece(daemon, monkeypatch):
    import cairn._fsspec_records

    fs = new_fs(daemon, durability="memory")
    path = unique("long") + "/blob.bin"
    data = np.random.default_rng(9).integers(0, 256, 6 << 20, dtype=np.uint8).tobytes()
    fs.pipe_file(path, data)
    monkeypatch.setattr(cairn._fsspec_records, "_PIN_LIMIT", 1 << 20)  # past it, no arena view is kept
    assert fs.cat_file(path) == data and fs.cat_file(path, 100, -100) == data[100:-100]


def test_json_text_round_trip_through_fsspec_open(daemon, monkeypatch):
    monkeypatch.setenv("CAIRN_SOCKET", daemon.socket)
    url = f"cairn://{unique('json')}/config.json"
    doc = {"lr": 0.1, "layers": [64, 32], "name": "ünïcode"}
    with fsspec.open(url, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    with fsspec.open(url, "r", encoding="utf-8") as f:
        assert json.load(f) == doc


def test_ranged_reads_read_only_the_pieces_they_need(daemon):
    fs = new_fs(daemon, durability="memory")
    path = unique("range") + "/big.bin"
    data = np.random.default_rng(7).integers(0, 256, 16 << 20, dtype=np.uint8).tobytes()
    fs.pipe_file(path, data)
    shown = fs.client.show(fs.info(path)["model"])
    offsets = np.cumsum([0] + [t["nbytes"] for t in shown["tensors"]])
    assert len(shown["tensors"]) >= 4
    asked = []
    real = fs.client.load_model

    def spy(id, names=None, **kw):
        asked.append(list(names))
        return real(id, names=names, **kw)

    fs.client.load_model = spy
    try:
        start, end = int(offsets[2]) + 10, int(offsets[3]) - 10  # inside the third piece
        assert fs.cat_file(path, start, end) == data[start:end]
        assert asked == [[shown["tensors"][2]["name"]]]
        assert fs.cat_file(path, -100) == data[-100:]
        assert fs.cat_file(path, 5, -5) == data[5:-5]
        assert fs.cat_file(path, len(data) + 10) == b""
        with fs.open(path, "rb", block_size=1 << 16) as f:
            f.seek(int(offsets[3]) + 1)
            asked.clear()
            assert f.read(1000) == data[int(offsets[3]) + 1:int(offsets[3]) + 1001]
            assert asked == [[shown["tensors"][3]["name"]]]
    finally:
        del fs.client.load_model


def test_torch_save_and_load_through_fsspec_open(daemon, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("CAIRN_SOCKET", daemon.socket)
    url = f"cairn://{unique('torch')}/model.pt"
    obj = {"state": {"w": torch.randn(64, 64), "step": torch.tensor(7)}, "epoch": 3, "note": "hi"}
    with fsspec.open(url, "wb") as f:
        torch.save(obj, f)
    with fsspec.open(url, "rb") as f:
        back = torch.load(f)
    assert back["epoch"] == 3 and back["note"] == "hi"
    assert torch.equal(back["state"]["w"], obj["state"]["w"]) and int(back["state"]["step"]) == 7
    buf = io.BytesIO()
    torch.save(obj, buf)
    fs, path = fsspec.core.url_to_fs(url)
    assert fs.cat_file(path) == buf.getvalue()  # the same bytes torch.save writes to a local file
    assert fs.client.show(fs.info(path)["model"])["metadata"][RECORD_KEY]["layout"] == "torch-zip"


# ---- deduplication ----

def test_a_checkpoint_with_one_percent_changed_stores_few_new_bytes(daemon, client):
    fs = new_fs(daemon, durability="global")
    path = unique("dedup") + "/ckpt.bin"
    rng = np.random.default_rng(3)
    first = rng.integers(0, 256, 32 << 20, dtype=np.uint8)
    fs.pipe_file(path, first.tobytes())
    before = physical_bytes(client)
    second = first.copy()
    mid = len(second) // 2
    second[mid:mid + len(second) // 100] = rng.integers(0, 256, len(second) // 100, dtype=np.uint8)  # 1 %
    second = np.concatenate([second[:4096], np.full(100, 7, np.uint8), second[4096:]])  # and an insertion
    fs.pipe_file(path, second.tobytes())
    added = physical_bytes(client) - before
    assert fs.cat_file(path) == second.tobytes()
    # The changed 1 % (320 KiB) and the insertion touch three pieces of about 600 KiB (1.2 MiB in
    # all here); cutting at fixed offsets, the insertion would have changed every piece.
    assert 0 < added < 2 << 20, added
    copy = path + ".copy"
    fs.cp_file(path, copy)  # inherits every tensor: nothing stored
    assert physical_bytes(client) - before == added
    assert fs.cat_file(copy) == second.tobytes()


def test_torch_archive_tensors_dedup_against_cairn_torch_save(daemon, client):
    torch = pytest.importorskip("torch")
    import cairn.torch as ct

    torch.manual_seed(0)
    sd = {"enc.weight": torch.randn(512, 512), "enc.bias": torch.randn(512),
          "head.weight": torch.randn(10, 512).to(torch.bfloat16), "steps": torch.arange(100000)}
    tensor_bytes = sum(t.numel() * t.element_size() for t in sd.values())
    ct.save(sd, unique("ct-model"), client=client)
    before = physical_bytes(client)
    fs = new_fs(daemon, durability="global")
    path = unique("ct-file") + "/model.pt"
    buf = io.BytesIO()
    torch.save(sd, buf)
    fs.pipe_file(path, buf.getvalue())
    added = physical_bytes(client) - before
    record = client.show(fs.info(path)["model"])["metadata"][RECORD_KEY]
    assert record["layout"] == "torch-zip" and record["records"] == len(sd)
    # Only the archive's own bytes (pickle, zip headers) are new, not the 1.9 MB of tensors.
    assert added < 64 << 10 < tensor_bytes, (added, tensor_bytes)
    assert fs.cat_file(path) == buf.getvalue()


# ---- versions, directories, copies, removal ----

def test_overwrite_commits_a_new_version_and_retires_the_old(daemon, client):
    fs = new_fs(daemon, durability="memory", metadata={"run": "a"})
    path = unique("ver") + "/f.txt"
    fs.pipe_file(path, b"one")
    v1 = fs.info(path)
    created = fs.created(path)
    fs.pipe_file(path, b"two", metadata={"epoch": 2})
    v2 = fs.info(path)
    assert (v1["model"], v2["model"]) == (f"{path}#v1", f"{path}#v2")
    assert fs.cat_file(path) == b"two"
    shown = client.show(v2["model"])
    assert shown["parent"] == v1["model"]
    assert {k: shown["metadata"][k] for k in ("run", "epoch")} == {"run": "a", "epoch": 2}
    assert client.show(v1["model"]).get("retired_ns")  # retired: readable by id until gc
    assert not client.show(v2["model"]).get("retired_ns")
    assert fs.created(path) == created and fs.modified(path) >= created
    fs.rm(path)
    assert not fs.exists(path)
    fs.pipe_file(path, b"three")  # the retired ids stay taken until gc: a later version
    assert fs.info(path)["version"] > 2 and fs.cat_file(path) == b"three"


def test_parent_durability_and_metadata_storage_options(daemon, client):
    base = unique("base")
    client.save_model(base, {"w": np.ones(4, np.float32)}, wait=True)
    fs = new_fs(daemon, durability="global", parent=base, metadata={"task": "t1"})
    path = unique("opts") + "/f.bin"
    with fs.open(path, "wb", metadata={"epoch": 1}) as f:
        f.write(b"x" * 100)
    shown = client.show(fs.info(path)["model"])
    assert shown["parent"] == base
    assert shown["metadata"]["task"] == "t1" and shown["metadata"]["epoch"] == 1
    assert shown["durability"] == "global"


def test_append_exclusive_and_transactions(daemon):
    fs = new_fs(daemon, durability="memory")
    root = unique("modes")
    with fs.open(f"{root}/log.csv", "a") as f:
        f.write("a,b\n")
    with fs.open(f"{root}/log.csv", "a") as f:
        f.write("1,2\n")
    assert fs.cat_file(f"{root}/log.csv") == b"a,b\n1,2\n"
    with pytest.raises(FileExistsError):
        fs.open(f"{root}/log.csv", "xb")
    with pytest.raises(FileExistsError):
        fs.pipe_file(f"{root}/log.csv", b"", mode="create")
    with fs.transaction:
        with fs.open(f"{root}/t.bin", "wb") as f:
            f.write(b"later")
        assert not fs.exists(f"{root}/t.bin")  # committed when the transaction ends
    assert fs.cat_file(f"{root}/t.bin") == b"later"
    with pytest.raises(RuntimeError):
        with fs.transaction:
            with fs.open(f"{root}/gone.bin", "wb") as f:
                f.write(b"never")
            raise RuntimeError("abort")
    assert not fs.exists(f"{root}/gone.bin")


def test_directories_listing_and_files_in_the_way(daemon):
    fs = new_fs(daemon, durability="memory")
    root = unique("tree")
    fs.pipe({f"{root}/a/x": b"1", f"{root}/a/b/y": b"22", f"{root}/z": b"333"})
    assert fs.ls(root, detail=False) == [f"{root}/a", f"{root}/z"]
    assert fs.find(root) == [f"{root}/a/b/y", f"{root}/a/x", f"{root}/z"]
    assert fs.find(root, maxdepth=1) == [f"{root}/z"]
    assert fs.du(root) == 6
    assert fs.isdir(f"{root}/a/b") and fs.isfile(f"{root}/a/b/y")
    assert fs.ls(f"{root}/z", detail=False) == [f"{root}/z"]
    fs.makedirs(f"{root}/empty", exist_ok=True)  # implied by files only: nothing to see
    assert not fs.exists(f"{root}/empty")
    with pytest.raises(FileExistsError):
        fs.makedirs(f"{root}/a")
    with pytest.raises(FileExistsError, match="in the way"):
        fs.mkdir(f"{root}/z/sub")
    with pytest.raises(NotADirectoryError):
        fs.pipe_file(f"{root}/z/inside", b"")
    with pytest.raises(IsADirectoryError):
        fs.pipe_file(f"{root}/a", b"")
    with pytest.raises(OSError):
        fs.rmdir(f"{root}/a")
    with pytest.raises(IsADirectoryError):
        fs.rm(f"{root}/a")
    fs.rm(f"{root}/a", recursive=True)
    assert fs.find(root) == [f"{root}/z"]


def test_mv_moves_files_without_copying_bytes(daemon, client):
    fs = new_fs(daemon, durability="global")
    root = unique("mv")
    big = np.random.default_rng(5).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    fs.pipe({f"{root}/src/f1": big, f"{root}/src/d/f2": b"two"})
    src_model = fs.info(f"{root}/src/f1")["model"]
    before = physical_bytes(client)
    fs.mv(f"{root}/src", f"{root}/dst", recursive=True)
    assert physical_bytes(client) == before
    assert fs.find(root) == [f"{root}/dst/d/f2", f"{root}/dst/f1"]
    assert fs.cat_file(f"{root}/dst/f1") == big and fs.cat_file(f"{root}/dst/d/f2") == b"two"
    assert client.show(fs.info(f"{root}/dst/f1")["model"])["parent"] == src_model


def test_foreign_models_are_read_only_directories_of_tensors(daemon, client):
    fs = new_fs(daemon, durability="memory")
    mid = unique("foreign") + "/net"
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    client.save_model(mid, {"layer1/weight": w, "bias": np.ones(3, np.float16)}, wait=True)
    info = fs.info(mid)
    assert info["type"] == "directory" and info["tensors"] == 2
    assert fs.ls(mid, detail=False) == [f"{mid}/bias", f"{mid}/layer1"]
    assert fs.find(mid) == [f"{mid}/bias", f"{mid}/layer1/weight"]
    assert fs.cat_file(f"{mid}/layer1/weight") == w.tobytes()
    assert fs.cat_file(f"{mid}/layer1/weight", 4, 12) == w.tobytes()[4:12]
    assert fs.info(f"{mid}/bias")["size"] == 6
    with pytest.raises(PermissionError, match="read-only"):
        fs.pipe_file(f"{mid}/new", b"x")
    with pytest.raises(PermissionError, match="immutable"):
        fs.rm(f"{mid}/bias")
    with pytest.raises(PermissionError, match="cannot be moved"):
        fs.mv(f"{mid}/bias", unique("elsewhere"))
    copy = unique("copied") + "/weight.bin"
    fs.cp_file(f"{mid}/layer1/weight", copy)  # a file of the tensor's bytes, inherited, not copied
    assert fs.cat_file(copy) == w.tobytes()
    assert client.show(fs.info(copy)["model"])["parent"] == mid
    fs.rm(mid, recursive=True)  # the model's whole directory: the model is retired
    assert client.show(mid).get("retired_ns") and not fs.exists(mid)


def test_put_file_and_get_file_round_trip(daemon, tmp_path):
    fs = new_fs(daemon, durability="memory")
    local = tmp_path / "in.bin"
    data = np.random.default_rng(11).integers(0, 256, 3 << 20, dtype=np.uint8).tobytes()
    local.write_bytes(data)
    path = unique("put") + "/in.bin"
    fs.put_file(str(local), path)
    fs.get_file(path, str(tmp_path / "out" / "copy.bin"))
    assert (tmp_path / "out" / "copy.bin").read_bytes() == data


def test_a_damaged_record_is_detected_on_a_whole_read(daemon, client, tmp_path):
    fs = new_fs(daemon, durability="memory")
    path = unique("damaged") + "/f"
    client.save_model(f"{path}#v1", {"file.000000": np.frombuffer(b"hello", np.uint8)}, wait=True, arch=_FILE_ARCH,
                      meta={RECORD_KEY: {"format": 1, "size": 5, "sha256": "0" * 64, "path": path}})
    assert fs.cat_file(path, 0, 4) == b"hell"  # a ranged read cannot check the whole file
    with pytest.raises(OSError, match="damaged"):
        fs.cat_file(path)
    with pytest.raises(OSError, match="damaged"):
        fs.get_file(path, str(tmp_path / "f"))
    assert not (tmp_path / "f").exists()


# ---- bad input ----

def test_bad_input_gives_clear_errors(daemon):
    fs = new_fs(daemon, durability="memory")
    with pytest.raises(ValueError, match="not a cairn:// URL"):
        fs.cat_file("s3://bucket/key")
    with pytest.raises(ValueError, match=r"'\.' and '\.\.'"):
        fs.cat_file("a/../b")
    missing = unique("missing") + "/nothing"
    with pytest.raises(FileNotFoundError, match=missing):
        fs.cat_file(missing)
    with pytest.raises(FileNotFoundError, match=missing):
        fs.open(missing, "rb")
    with pytest.raises(IsADirectoryError):
        fs.pipe_file("", b"x")
    directory = unique("dir")
    fs.pipe_file(f"{directory}/x", b"x")
    with pytest.raises(IsADirectoryError):
        fs.open(directory, "rb")
    with pytest.raises(ValueError, match="no '\\?' query"):
        fs.pipe_file("a?parent=b", b"x")
    with pytest.raises(ValueError, match="mode 'r\\+b'"):
        fs.open(unique("m"), "r+b")
    with pytest.raises(ValueError, match="durability='fast'"):
        new_fs(daemon, durability="fast")
    with pytest.raises(TypeError, match="'durabilty' is unknown"):
        new_fs(daemon, durabilty="memory")
    with pytest.raises(ValueError, match="reserved"):
        new_fs(daemon, metadata={RECORD_KEY: 1})
    with pytest.raises(ValueError, match="not JSON"):
        new_fs(daemon, metadata={"x": object()})
    with pytest.raises(ValueError, match="parent='no-such-model'"):
        fs.pipe_file(unique("p") + "/f", b"x", parent="no-such-model")
    with pytest.raises(TypeError, match="'colour'"):
        fs.open(unique("o"), "wb", colour="red")
    with pytest.raises(cairn.Unavailable, match="/nonexistent/cairnd.sock"):
        CairnFileSystem(socket="/nonexistent/cairnd.sock", skip_instance_cache=True).ls("")


# ---- the entry point, in an interpreter that never imports cairn itself ----

def _site_with_entry_point(tmp_path: Path) -> str:
    """A directory for PYTHONPATH that declares the `fsspec.specs` entry point as
    api/python/pyproject.toml does, for a .venv without the editable install; "" when the
    installed `cairn` distribution declares it already."""
    try:
        eps = importlib.metadata.distribution("cairn").entry_points
        if any(e.group == "fsspec.specs" and e.name == "cairn" for e in eps):
            return ""
    except importlib.metadata.PackageNotFoundError:
        pass
    project = tomllib.loads((ROOT / "api" / "python" / "pyproject.toml").read_text())["project"]
    dist = tmp_path / "site" / f"cairn-{project['version']}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: cairn\nVersion: {project['version']}\n")
    specs = project["entry-points"]["fsspec.specs"]
    (dist / "entry_points.txt").write_text("[fsspec.specs]\n" + "".join(f"{k} = {v}\n" for k, v in specs.items()))
    return str(tmp_path / "site")


def test_fsspec_open_in_a_fresh_interpreter_uses_the_entry_point(daemon, tmp_path):
    fs = new_fs(daemon, durability="memory")
    root = unique("ep")
    fs.pipe_file(f"{root}/in.txt", b"from the test")
    script = f"""
import sys, fsspec
from fsspec.registry import known_implementations
assert known_implementations["cairn"]["class"] == "cairn.fsspec.CairnFileSystem", known_implementations.get("cairn")
assert "cairn" not in sys.modules
with fsspec.open("cairn://{root}/in.txt", "rb") as f:
    assert f.read() == b"from the test"
with fsspec.open("cairn://{root}/out.txt", "w") as f:
    f.write("from the child")
print(type(fsspec.filesystem("cairn")).__module__)
"""
    site = _site_with_entry_point(tmp_path)
    path = os.pathsep.join(p for p in [str(ROOT / "api" / "python"), site] if p)
    env = dict(os.environ, CAIRN_SOCKET=daemon.socket, PYTHONPATH=path)
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "cairn.fsspec"
    assert fs.cat_file(f"{root}/out.txt") == b"from the child"


# ---- Lightning: default_root_dir="cairn://..." with no plugin ----

def test_lightning_trainer_saves_to_and_resumes_from_cairn(daemon, monkeypatch):
    torch = pytest.importorskip("torch")
    pl = pytest.importorskip("lightning.pytorch")
    monkeypatch.setenv("CAIRN_SOCKET", daemon.socket)

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, _):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 1))

    def trainer(epochs):
        return pl.Trainer(default_root_dir=root, max_epochs=epochs, accelerator="cpu", devices=1,
                          enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1)

    def loader():
        return torch.utils.data.DataLoader(data, batch_size=4)

    root = f"cairn://{unique('lightning')}"
    torch.manual_seed(0)
    first = Tiny()
    trainer(1).fit(first, loader())
    fs, base = fsspec.core.url_to_fs(root)
    ckpts = [p for p in fs.find(base) if p.endswith(".ckpt")]
    assert ckpts == [f"{base}/lightning_logs/version_0/checkpoints/epoch=0-step=2.ckpt"]
    assert fs.client.show(fs.info(ckpts[0])["model"])["metadata"][RECORD_KEY]["layout"] == "torch-zip"
    assert fs.isfile(f"{base}/lightning_logs/version_0/metrics.csv")  # the CSV logger's, appended to

    resumed = trainer(2)
    second = Tiny()
    resumed.fit(second, loader(), ckpt_path=f"cairn://{ckpts[0]}")
    assert resumed.global_step == 4 and resumed.current_epoch == 2
    assert fs.isfile(f"{base}/lightning_logs/version_1/checkpoints/epoch=1-step=4.ckpt")
