"""Lightning's CheckpointIO on cairn (cairn.lightning.CairnCheckpointIO, docs/frameworks.md): real
cairnd, real Lightning Trainers on the CPU.

- A 4-epoch fit of a small MLP whose body is frozen, with ModelCheckpoint(save_top_k=2,
  save_last=True): every checkpoint is a cairn model derived from the one saved before it; only the
  top 2 and last stay live (the dropped ones are retired, their pointer files gone); each live
  checkpoint loads back equal to torch.load of the same dict saved the default way; the
  checkpoints after the first store a small fraction of its bytes (the frozen layers are inherited).
- A fit interrupted by an exception and resumed with ckpt_path="last" (a fresh model, a new
  Trainer and plugin) ends with weights identical to the uninterrupted fit's, and its first
  checkpoint derives from the one it resumed from.
- save_last="link": last.ckpt is a symbolic link to a pointer file; loading and removing it.
- Values JSON cannot hold, tuples, integer keys, non-finite floats, bf16, Parameters, shared
  tensors and OrderedDict._metadata come back as saved; map_location; storage_options.
- An unreachable daemon: cairn.Unavailable naming the socket and the checkpoint; with
  fallback=True ordinary checkpoint files and a logged warning.
"""
import io
import json
import logging
import math
import os
from collections import OrderedDict
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

import cairn  # noqa: E402
from cairn.lightning import CHECKPOINT_TYPE, PICKLED_TENSOR, RECORD_KEY, CairnCheckpointIO  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

EPOCHS = 4


class Net(pl.LightningModule):
    """A 2-layer MLP body (frozen unless ``frozen=False``) under a trainable head; Adam + StepLR."""

    def __init__(self, frozen: bool = True):
        super().__init__()
        self.save_hyperparameters()
        self.body = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU())
        self.head = nn.Linear(256, 4)
        if frozen:
            self.body.requires_grad_(False)

    def forward(self, x):
        return self.head(self.body(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self):
        opt = torch.optim.Adam([p for p in self.parameters() if p.requires_grad], lr=1e-2)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, 0.9)}


def _data():
    g = torch.Generator().manual_seed(7)
    train = torch.utils.data.TensorDataset(torch.randn(64, 32, generator=g), torch.randint(0, 4, (64,), generator=g))
    val = torch.utils.data.TensorDataset(torch.randn(32, 32, generator=g), torch.randint(0, 4, (32,), generator=g))
    return (torch.utils.data.DataLoader(train, batch_size=16, shuffle=False),
            torch.utils.data.DataLoader(val, batch_size=16, shuffle=False))


def _model(seed=0):
    torch.manual_seed(seed)
    return Net()


def _trainer(plugin, dirpath, callbacks=(), save_last=True, epochs=EPOCHS):
    ckpt = ModelCheckpoint(dirpath=dirpath, monitor="val_loss", save_top_k=2, save_last=save_last)
    return pl.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, enable_progress_bar=False, logger=False,
                      enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=dirpath,
                      plugins=[plugin], callbacks=[ckpt, *callbacks]), ckpt


class Recording(CairnCheckpointIO):
    """The plugin, noting per save: the model, the repository's physical bytes it added, and the
    size of the same dict saved with torch.save (kept under ``refdir``, by file name, as reference)."""

    def __init__(self, *args, refdir, **kwargs):
        super().__init__(*args, **kwargs)
        self.refdir = Path(refdir)
        self.saves = []

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        before = self.client().stats()["repository"]["physical_bytes"]
        super().save_checkpoint(checkpoint, path, storage_options)
        stored = self.client().stats()["repository"]["physical_bytes"] - before
        buf = io.BytesIO()
        torch.save(checkpoint, buf)
        self.refdir.mkdir(parents=True, exist_ok=True)
        (self.refdir / Path(path).name).write_bytes(buf.getvalue())
        self.saves.append({"path": str(path), "model": self.last_model, "stored": stored, "file": len(buf.getvalue())})


def assert_same(a, b, where="checkpoint"):
    """``a`` and ``b`` are the same nested value: types, key order, tensors bit for bit (dtype,
    shape, device, requires_grad), OrderedDict._metadata, NaNs and signed zeros."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape, a.device, a.requires_grad) == (b.dtype, b.shape, b.device, b.requires_grad), where
        bits = lambda t: t.detach().reshape(-1).contiguous().view(torch.uint8)  # noqa: E731
        assert torch.equal(bits(a), bits(b)), f"{where}: values differ"
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{where}: keys {list(a)} != {list(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
        assert_same(getattr(a, "_metadata", None), getattr(b, "_metadata", None), f"{where}._metadata")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float):
        assert (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b)), where
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _live(client, prefix):
    return {m["id"] for m in client.list() if m["id"].startswith(prefix)}


@pytest.fixture(scope="module")
def fitted(daemon, tmp_path_factory):
    """One uninterrupted 4-epoch fit through the recording plugin."""
    root = tmp_path_factory.mktemp("fit")
    plugin = Recording(daemon.socket, refdir=root / "ref")
    trainer, ckpt = _trainer(plugin, root / "ckpt")
    model = _model()
    trainer.fit(model, *_data())
    return {"root": root, "plugin": plugin, "ckpt": ckpt, "model": model}


def test_fit_keeps_top2_and_last_as_a_parent_chain(fitted, client):
    plugin, ckpt = fitted["plugin"], fitted["ckpt"]
    dirpath = Path(ckpt.dirpath)
    saves = plugin.saves
    assert len(saves) == 2 * EPOCHS  # a top-k checkpoint and last.ckpt at the end of each epoch

    # The pointer files are what ModelCheckpoint keeps: the top 2 and last.
    files = {str(p) for p in dirpath.iterdir()}
    assert files == set(ckpt.best_k_models) | {ckpt.last_model_path}
    assert len(files) == 3
    # Exactly their models are live; every earlier one was retired (by top-k or by an overwrite of last.ckpt).
    named = {}
    for f in files:
        record = json.loads(Path(f).read_text())[RECORD_KEY]
        named[f] = record["model"]
    assert _live(client, "lightning:" + str(dirpath)) == set(named.values())
    assert all(m.startswith(f"lightning:{f}#v") for f, m in named.items())
    for s in saves:
        shown = client.show(s["model"])
        assert bool(shown.get("retired_ns")) == (s["model"] not in named.values()), s
        assert shown["metadata"][RECORD_KEY]["path"] == s["path"]
        assert shown["metadata"]["epoch"] in range(EPOCHS)
        assert "pickled" not in shown["metadata"][RECORD_KEY]  # a Lightning checkpoint is tensors + JSON

    # The catalog finds them by their metadata.
    found = client.query({"op": "find", "contains_path": [CHECKPOINT_TYPE],
                          "where": {"epoch": {">=": 1}, RECORD_KEY: {"path": {">=": f"{dirpath}/", "<": f"{dirpath}0"}}}})
    assert set(found["models"]) == {m for m in named.values() if client.show(m)["metadata"]["epoch"] >= 1}

    # Each derives from the checkpoint saved before it.
    assert client.show(saves[0]["model"])["parent"] is None
    for prev, cur in zip(saves, saves[1:]):
        assert client.show(cur["model"])["parent"] == prev["model"]
    assert client.lineage(saves[-1]["model"])["ancestors"] == [s["model"] for s in reversed(saves[:-1])]


def test_checkpoints_load_as_torch_load_of_the_default_file(fitted):
    plugin = fitted["plugin"]
    for path in Path(fitted["ckpt"].dirpath).iterdir():
        got = plugin.load_checkpoint(path)
        ref = torch.load(fitted["root"] / "ref" / path.name, weights_only=False)
        assert_same(got, ref, path.name)
        assert got["state_dict"]["head.weight"].dtype == torch.float32
    last = plugin.load_checkpoint(fitted["ckpt"].last_model_path)
    for name, t in fitted["model"].state_dict().items():
        assert torch.equal(last["state_dict"][name], t), name


def test_later_checkpoints_store_only_what_changed(fitted):
    saves = fitted["plugin"].saves
    first = saves[0]["stored"]
    assert first >= 0.9 * (32 * 256 + 256 + 256 * 256 + 256) * 4  # the frozen body, stored once
    for s in saves[1:]:
        assert s["stored"] <= 0.3 * first, s
    for s in saves[1::2]:  # last.ckpt: the same state as the top-k checkpoint just before it
        assert s["stored"] == 0, s
    print("\ncairn.lightning bytes stored per checkpoint (repository physical bytes added) vs torch.save size:")
    for s in saves:
        print(f"  {os.path.basename(s['path']):28s} cairn {s['stored']:>8d} B   torch.save {s['file']:>8d} B")
    print(f"  total: cairn {sum(s['stored'] for s in saves)} B, torch.save {sum(s['file'] for s in saves)} B")


class _Interrupt(pl.Callback):
    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch == 2:
            raise RuntimeError("interrupted by the test")


def test_interrupted_fit_resumes_from_last_with_identical_weights(fitted, daemon, client, tmp_path):
    dirpath = tmp_path / "ckpt"
    first = CairnCheckpointIO(daemon.socket)
    trainer, _ = _trainer(first, dirpath, callbacks=[_Interrupt()])
    with pytest.raises(RuntimeError, match="interrupted by the test"):
        trainer.fit(_model(), *_data())
    resumed_from = first.last_model
    assert resumed_from is not None and resumed_from.startswith(f"lightning:{dirpath}/last.ckpt#v")

    second = CairnCheckpointIO(daemon.socket)
    trainer, ckpt = _trainer(second, dirpath)
    model = _model(seed=123)  # other initial weights: they must come from the checkpoint
    trainer.fit(model, *_data(), ckpt_path="last")
    assert trainer.current_epoch == EPOCHS
    expected = fitted["model"].state_dict()
    for name, t in model.state_dict().items():
        assert torch.equal(t, expected[name]), name

    # The resumed run's first checkpoint derives from the one it resumed from.
    chain = client.lineage(second.last_model)["ancestors"]
    assert resumed_from in chain
    assert _live(client, f"lightning:{dirpath}") == {
        json.loads(Path(p).read_text())[RECORD_KEY]["model"] for p in Path(dirpath).iterdir()}


def test_save_last_link(daemon, client, tmp_path):
    plugin = CairnCheckpointIO(daemon.socket, prefix="link:")
    trainer, ckpt = _trainer(plugin, tmp_path / "ckpt", save_last="link", epochs=3)
    model = _model()
    trainer.fit(model, *_data())
    last = Path(ckpt.last_model_path)
    target_path = os.path.realpath(last)
    assert last.is_symlink() and target_path in ckpt.best_k_models  # the newest top-k pointer file
    assert_same(plugin.load_checkpoint(last), plugin.load_checkpoint(target_path))
    target = json.loads(last.read_text())[RECORD_KEY]["model"]
    plugin.remove_checkpoint(last)  # only the link goes
    assert not last.exists() and target in _live(client, "link:")


def test_values_json_cannot_hold_and_placement(daemon, client, tmp_path):
    sd = OrderedDict([("w", torch.arange(6.0).reshape(2, 3)), ("b", torch.ones(2, dtype=torch.bfloat16)),
                      ("n", torch.tensor(3))])
    sd._metadata = OrderedDict([("", {"version": 1})])
    ck = {"epoch": 2, "global_step": 40, "t": (1, 2.5, float("nan"), float("-inf")), 3: "int key", "$x": -0.0,
          "big": 1 << 70, "sd": sd, "path": Path("/x"), "dtype": torch.float16,
          "complex": torch.zeros(2, dtype=torch.complex64), "p": nn.Parameter(torch.ones(3)),
          "same": sd["w"], "empty": torch.empty(0, 5), "opt": {"state": {0: {"step": torch.tensor(4.0)}},
                                                                "param_groups": [{"betas": (0.9, 0.99), "params": [0]}]}}
    plugin = CairnCheckpointIO(daemon.socket, prefix="odd:", metadata={"task": "unit"})
    path = tmp_path / "odd.ckpt"
    plugin.save_checkpoint(ck, path, storage_options={"metadata": {"note": "first"}, "durability": "memory"})
    got = plugin.load_checkpoint(path, weights_only=False)
    assert_same(got, ck)
    assert got["same"] is got["sd"]["w"]
    shown = client.show(plugin.last_model)
    meta = shown["metadata"]
    assert (meta["task"], meta["note"], meta["epoch"], meta["global_step"]) == ("unit", "first", 2, 40)
    assert meta[RECORD_KEY]["pickled"] == PICKLED_TENSOR  # the Path, the dtype and the complex tensor
    assert {t["name"] for t in shown["tensors"]} >= {"sd/w", "sd/b", "p", "opt/state/0/step", PICKLED_TENSOR}

    for where in ("cpu", torch.device("cpu"), {"cpu": "cpu"}, lambda storage, loc: storage):
        assert_same(plugin.load_checkpoint(path, map_location=where, weights_only=False), ck)

    # Saving again to the path: a new version derived from the first, the first retired.
    plugin.save_checkpoint(ck, path)
    v1, v2 = f"odd:{path}#v1", f"odd:{path}#v2"
    assert plugin.last_model == v2 and client.show(v2)["parent"] == v1 and client.show(v1).get("retired_ns")
    plugin.remove_checkpoint(path)
    assert not path.exists() and client.show(v2).get("retired_ns")
    with pytest.raises(FileNotFoundError, match="odd.ckpt"):
        plugin.load_checkpoint(path)
    plugin.remove_checkpoint(path)  # no file: nothing to do
    path.write_text('{"cairn.lightning": {"format": 1, "model": "odd:gone#v1"}}\n')
    with pytest.raises(cairn.NotFound, match="odd:gone#v1.*odd.ckpt"):
        plugin.load_checkpoint(path)
    path.unlink()

    with pytest.raises(TypeError, match="'parnet' unknown"):
        plugin.save_checkpoint(ck, path, storage_options={"parnet": v1})
    with pytest.raises(ValueError, match="durability"):
        CairnCheckpointIO(daemon.socket, durability="fast")


def test_unreachable_daemon(tmp_path, caplog):
    sock = tmp_path / "nobody" / "cairnd.sock"
    path = tmp_path / "a.ckpt"
    ck = {"epoch": 0, "state_dict": {"w": torch.ones(3)}}
    with pytest.raises(cairn.Unavailable) as e:
        CairnCheckpointIO(sock).save_checkpoint(ck, path)
    assert str(sock) in str(e.value) and str(path) in str(e.value) and "fallback=True" in str(e.value)
    assert not path.exists()

    # A pointer file whose daemon is gone: the same one-line error, naming the checkpoint.
    path.write_text('{"cairn.lightning": {"format": 1, "model": "lightning:x#v1"}}\n')
    with pytest.raises(cairn.Unavailable, match=str(sock)):
        CairnCheckpointIO(sock).load_checkpoint(path)
    path.unlink()

    plugin = CairnCheckpointIO(sock, fallback=True)
    with caplog.at_level(logging.WARNING, logger="cairn.lightning"):
        plugin.save_checkpoint(ck, path)
    assert any(str(sock) in r.getMessage() and "TorchCheckpointIO" in r.getMessage() for r in caplog.records)
    assert_same(torch.load(path, weights_only=True), ck)  # an ordinary checkpoint file
    assert_same(plugin.load_checkpoint(path), ck)
    plugin.remove_checkpoint(path)
    assert not path.exists()
