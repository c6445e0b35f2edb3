"""progress= on the helpers that move whole models: a bar on stderr when asked, nothing by default."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import cairn.torch as ct  # noqa: E402
from cairn import io as cio  # noqa: E402


def state(mib):
    g = torch.Generator().manual_seed(0)
    return {f"layer{i}.weight": torch.rand((1 << 18,), generator=g) for i in range(mib)}  # 1 MiB each


def test_torch_save_with_progress_writes_a_bar_to_stderr(client, capfd):
    sd = state(96)
    ct.save(sd, "progress-on", client=client, progress=True)
    out, err = capfd.readouterr()
    assert out == ""
    assert "save progress-on" in err
    assert "96.0M" in err  # tqdm's total in binary units (unit_divisor 1024): 96.0M
    back = ct.load("progress-on", client=client)
    assert all(torch.equal(back[k], v) for k, v in sd.items())


def test_torch_save_by_default_writes_nothing(client, capfd):
    ct.save(state(8), "progress-off", client=client)
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_import_file_with_progress(client, capfd, tmp_path):
    path = tmp_path / "m.pt"
    torch.save(state(16), path)
    cio.import_file(client, "imported", path, progress=True)
    cio.export_file(client, "imported", tmp_path / "back.pt", progress=True)
    out, err = capfd.readouterr()
    assert "import imported" in err and "export imported" in err
    cio.import_file(client, "imported-quiet", path)
    out, err = capfd.readouterr()
    assert err == ""
    back = torch.load(tmp_path / "back.pt", weights_only=True)
    assert np.array_equal(back["layer0.weight"].numpy(), state(1)["layer0.weight"].numpy())
