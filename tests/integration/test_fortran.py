"""The Fortran module `cairn` (api/fortran) from a real Fortran program, tests/fortran/test_cairn.f90
(built as bin/fortran_api_test when CMake found a Fortran compiler), against a real cairnd started
by pid; and the array layout seen from Python: a Fortran array of shape (n1, n2) is the numpy array
of shape (n2, n1), its transpose (docs/fortran.md, "Array layout")."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import BUILD, LIBCAIRN, SOURCE

PROGRAM = BUILD / "bin" / "fortran_api_test"

pytestmark = pytest.mark.skipif(
    not PROGRAM.exists(),
    reason=f"{PROGRAM} was not built: this build has no Fortran (CMake found no Fortran compiler, or "
           "CAIRN_WITH_FORTRAN=OFF; Debian: apt-get install gfortran, then configure again)")

# The Python side runs in this process over libcairn.so; a sanitized library cannot be loaded here
# (Python is not built with the sanitizers), so then only the Fortran program runs.
PYTHON_SIDE = os.environ.get("CAIRN_SANITIZED") != "1"

KINDS = ("real32", "real64", "int32", "int64")


def _cairn():
    sys.path.insert(0, str(SOURCE / "api" / "python"))
    os.environ.setdefault("CAIRN_LIBRARY", str(LIBCAIRN))
    import cairn
    return cairn


def _fortran_layout():
    """What the program stores as fortran/layout: a(i, j) = 10 i + j, shape (2, 3), in Fortran's
    own indices; here built as the (2, 3) numpy array that holds the same elements."""
    i, j = np.meshgrid(np.arange(1, 3), np.arange(1, 4), indexing="ij")
    return (10 * i + j).astype(np.float64)


def _run(daemon, *args):
    r = subprocess.run([str(PROGRAM), *args], env=daemon.env, capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert " 0 failed" in r.stdout, out
    assert "FAIL" not in r.stdout, out
    return r.stdout


def test_fortran_program(daemon):
    python_layout = np.arange(6.0).reshape(3, 2) * 1.5
    if PYTHON_SIDE:
        cairn = _cairn()
        with cairn.connect(daemon.socket) as c:
            c.put_tensor("python/layout", python_layout)

    out = _run(daemon)
    lines = out.splitlines()
    for kind in KINDS:
        for rank in range(1, 5):
            label = f"{kind} rank {rank}"
            assert any(line.startswith(f"PASS put/unpack {label} (") for line in lines), f"{label}:\n{out}"
            assert f"PASS poll not found after delete {label}" in lines, out
            assert f"PASS unpack deleted {label} (not found: " in out, out
    for check in ("PASS unpack unknown key (not found: ", "PASS model round trip inherited tensor exact",
                  "PASS model round trip added tensor exact", "PASS the child's ancestors list the parent",
                  "PASS inherit_all kept both parent tensors", "PASS status constants generated from status_codes.h"):
        assert check in out, out
    if PYTHON_SIDE:
        assert "PASS python layout: a(i,j) is numpy [j-1,i-1]" in lines, out
    else:
        assert "SKIP python layout" in out, out

    if not PYTHON_SIDE:
        return
    cairn = _cairn()
    with cairn.connect(daemon.socket) as c:
        # A Fortran (2, 3) array is seen as its transpose, shape (3, 2), with no copy made.
        got = c.get_tensor("fortran/layout")
        assert got.shape == (3, 2)
        np.testing.assert_array_equal(got, _fortran_layout().T)
        assert got[2, 1] == 10 * 2 + 3  # Fortran a(2, 3) is numpy [3-1, 2-1]
        # The model tensors too: layer1.weight is a Fortran real32 (4, 3) with w(i, j) = 0.3 * (i + 4 (j-1)).
        m = c.load_model("f-child", copy=True)
        w = m["layer1.weight"]
        assert w.shape == (3, 4) and w.dtype == np.float32
        expected = (np.arange(1, 13, dtype=np.float32) * np.float32(0.3)).reshape(3, 4)  # column-major fill
        np.testing.assert_array_equal(w, expected)
        assert m["layer2.weight"].shape == (2, 2, 3)
        assert "f-base" in str(c.lineage("f-child")["ancestors"])


def test_fortran_program_twice_on_one_repository(daemon):
    """The model ids take a suffix, so a second run on the same daemon commits new models."""
    _run(daemon, "-a")
    out = _run(daemon, "-b")
    assert "PASS model create f-base-b" in out, out


@pytest.mark.skipif(shutil.which("gfortran") is None or shutil.which("pkg-config") is None,
                    reason="needs gfortran and pkg-config on PATH")
def test_outside_program_builds_with_pkg_config(daemon, tmp):
    """As a user would: `gfortran $(pkg-config --cflags --libs cairn-fortran)` finds cairn.mod,
    libcairn_fortran.a and libcairn.so in the build tree."""
    env = dict(daemon.env, PKG_CONFIG_PATH=str(BUILD / "pkgconfig"))
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "cairn-fortran"], env=env, capture_output=True,
                           text=True, check=True).stdout.split()
    assert any(f.endswith("include/cairn/fortran") for f in flags), flags
    exe = tmp / "outside_fortran"
    sanitize = ["-fsanitize=address,undefined"] if os.environ.get("CAIRN_SANITIZED") == "1" else []
    subprocess.run(["gfortran", "-std=f2018", *sanitize, "-o", str(exe),
                    str(SOURCE / "tests" / "fortran" / "test_cairn.f90"), *flags], check=True, env=env)
    out = subprocess.run([str(exe), "-outside"], env=daemon.env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert " 0 failed" in out.stdout, out.stdout
