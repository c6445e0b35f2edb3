"""`cmake --install` gives a tree that works on its own (docs/install.md).

The build ($CAIRN_BUILD_DIR) is installed into a temporary prefix once for this module; then, with
an environment that names nothing of the build or the source tree (no LD_LIBRARY_PATH, PYTHONPATH,
PKG_CONFIG_PATH, CAIRN_BUILD_DIR):
  - the installed layout is complete and names no build or source path; the programs and the library
    resolve every shared library they need (RUNPATH $ORIGIN/../lib);
  - `cairn --version`, `cairnd --version`, `cairn-sim --version` print the project version;
  - an outside project is built against the installed tree twice, with CMake's
    find_package(cairn) + cairn::cairn and with `pkg-config --cflags --libs cairn`: a C program over
    cairn/cairn.h and a C++ one over cairn/client.hpp, each run against a cairnd started from the
    installed tree (by pid, its socket in a temp directory, stopped by pid);
  - the installed Python package imports from its installed location and loads the installed
    libcairn.so; the installed `cairn import` of a .pt file runs the Python it was told to
    ($CAIRN_PYTHON) with the installed package; the installed package imports and exports Keras
    HDF5 files through the installed libcairn_keras_h5.so (built with HDF5), with no `cairn` on PATH.
"""
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

SOURCE = Path(os.environ.get("CAIRN_SOURCE_DIR", Path(__file__).resolve().parents[2]))
BUILD = Path(os.environ.get("CAIRN_BUILD_DIR", SOURCE / "build"))

# What the outside project's programs do: store a tensor through the daemon and read it back.
C_CLIENT = r"""
#include <stdio.h>
#include <string.h>
#include <cairn/cairn.h>

int main(void) {
  cairn_client *c = NULL;
  if (cairn_connect(NULL, &c) != CAIRN_OK) { fprintf(stderr, "connect: %s\n", cairn_last_error()); return 1; }
  float in[6] = {1, 2, 3, 4, 5, 6}, out[6] = {0};
  int64_t shape[2] = {2, 3};
  if (cairn_put_tensor(c, "install/c", in, CAIRN_DTYPE_F32, 2, shape) != CAIRN_OK ||
      cairn_unpack_tensor(c, "install/c", out, sizeof out) != CAIRN_OK) {
    fprintf(stderr, "tensor: %s\n", cairn_last_error());
    return 1;
  }
  if (memcmp(in, out, sizeof in) != 0) { fprintf(stderr, "different bytes\n"); return 1; }
  cairn_disconnect(c);
  printf("c ok\n");
  return 0;
}
"""

CPP_CLIENT = r"""
#include <cstdio>
#include <vector>
#include <cairn/client.hpp>

int main() {
  auto client = cairn::v1::Client::connect();
  if (!client) { std::fprintf(stderr, "connect: %s\n", client.status().message().c_str()); return 1; }
  std::vector<double> in{0.5, 1.5, 2.5, 3.5}, out(4);
  if (!client->tensor_put("install/cpp", in.data(), CAIRN_DTYPE_F64, {4}) ||
      !client->tensor_unpack("install/cpp", out.data(), out.size() * sizeof(double)) || in != out) {
    std::fprintf(stderr, "tensor round trip failed\n");
    return 1;
  }
  std::printf("c++ ok\n");
  return 0;
}
"""

CMAKE_PROJECT = """cmake_minimum_required(VERSION 3.16)
project(cairn_consumer C CXX)
find_package(cairn {version} REQUIRED)
add_executable(c_client client.c)
target_link_libraries(c_client PRIVATE cairn::cairn)
add_executable(cpp_client client.cpp)
target_link_libraries(cpp_client PRIVATE cairn::cairn)
"""


def cache(name):
    """A value from the build's CMakeCache.txt (None when absent)."""
    for line in (BUILD / "CMakeCache.txt").read_text().splitlines():
        m = re.match(rf"{re.escape(name)}:[A-Z]+=(.*)$", line)
        if m:
            return m.group(1)
    return None


def project_version():
    m = re.search(r"project\(cairn\s+VERSION\s+([0-9.]+)", (SOURCE / "CMakeLists.txt").read_text())
    assert m, "no project(cairn VERSION ...) in CMakeLists.txt"
    return m.group(1)


CMAKE = cache("CMAKE_COMMAND") or "cmake"
LIBDIR = cache("CMAKE_INSTALL_LIBDIR") or "lib"
PYTHONDIR = cache("CAIRN_INSTALL_PYTHONDIR") or "lib/python3/dist-packages"


def clean_env(**extra):
    """The environment of a user of the installed tree: nothing points at the build or source tree."""
    drop = {"LD_LIBRARY_PATH", "PYTHONPATH", "PKG_CONFIG_PATH", "CMAKE_PREFIX_PATH", "CAIRN_BUILD_DIR",
            "CAIRN_SOURCE_DIR", "CAIRN_LIBRARY", "CAIRN_PYTHON", "CAIRN_SOCKET", "LD_PRELOAD"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PATH"] = ":".join(p for p in env.get("PATH", "/usr/bin:/bin").split(":")
                           if p and not p.startswith(str(BUILD)))
    env.update(extra)
    return env


def run(cmd, timeout=600, **kw):
    kw.setdefault("env", clean_env())
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r


@pytest.fixture(scope="module")
def tmp():
    d = Path(tempfile.mkdtemp(prefix="cairn-inst-", dir="/tmp"))  # short: Unix socket paths <= 107 bytes
    yield d
    if not os.environ.get("CAIRN_KEEP_TMP"):
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def prefix(tmp):
    p = tmp / "prefix"
    run([CMAKE, "--install", BUILD, "--prefix", p])
    return p


class InstalledDaemon:
    """cairnd from the installed tree, by pid, with its socket and repository under root."""

    def __init__(self, prefix, root):
        root.mkdir(parents=True, exist_ok=True)
        self.socket = str(root / "run" / "cairnd.sock")
        config = root / "cairn.yaml"
        config.write_text(f"socket: {self.socket}\nrepository: {root / 'repo'}\n"
                          f"tiers:\n  dram:\n    capacity: 64MiB\n"
                          f"log:\n  level: warn\n  file: {root / 'cairnd.log'}\n")
        self.env = clean_env(CAIRN_SOCKET=self.socket)
        self.proc = subprocess.Popen([str(prefix / "bin" / "cairnd"), "--config", str(config)], env=self.env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"installed cairnd exited with {self.proc.returncode}: "
                                   f"{self.proc.stderr.read().decode()}")
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.connect(self.socket)
                return
            except OSError:
                if time.time() > deadline:
                    self.stop()
                    raise RuntimeError("installed cairnd did not listen within 30 s")
                time.sleep(0.02)

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc.stderr.close()
        return self.proc.returncode


@pytest.fixture(scope="module")
def daemon(prefix, tmp):
    d = InstalledDaemon(prefix, tmp / "daemon")
    yield d
    assert d.stop() == 0


def test_installed_layout_is_complete_and_names_no_build_path(prefix):
    lib = prefix / LIBDIR
    for rel in ("bin/cairnd", "bin/cairn", "bin/cairn-sim"):
        assert os.access(prefix / rel, os.X_OK), rel
    for rel in ("include/cairn/cairn.h", "include/cairn/client.hpp", "include/cairn/status_codes.h",
                f"{LIBDIR}/pkgconfig/cairn.pc", f"{LIBDIR}/cmake/cairn/cairnConfig.cmake",
                f"{LIBDIR}/cmake/cairn/cairnConfigVersion.cmake", f"{LIBDIR}/cmake/cairn/cairnTargets.cmake",
                f"{PYTHONDIR}/cairn/__init__.py", f"{PYTHONDIR}/cairn/io.py", f"{PYTHONDIR}/cairn/_installed.py"):
        assert (prefix / rel).is_file(), rel
    assert (lib / "libcairn.so").exists() and (lib / "libcairn.so.0").exists()
    assert (lib / "libcairn_keras_h5.so").exists() == (cache("CAIRN_WITH_HDF5") == "ON")
    assert not list((prefix / PYTHONDIR / "cairn").glob("__pycache__"))
    # The batch-system integrations, executable as in the source tree.
    for rel in ("share/cairn/slurm/prolog", "share/cairn/slurm/task_prolog", "share/cairn/slurm/epilog"):
        assert (prefix / rel).stat().st_mode & stat.S_IXUSR, rel
    assert (prefix / "share/cairn/pbs/cairn_hook.py").is_file()

    # Text files of the installed tree do not point back at the build or the source tree.
    texts = [f"{LIBDIR}/pkgconfig/cairn.pc", f"{PYTHONDIR}/cairn/_installed.py",
             *(str(p.relative_to(prefix)) for p in (lib / "cmake" / "cairn").glob("*.cmake"))]
    for rel in texts:
        text = (prefix / rel).read_text()
        assert str(BUILD) not in text and str(SOURCE) + "/" not in text, rel
    # cairn::cairn needs nothing from the consumer: no link interface, hence no find_dependency.
    targets = (lib / "cmake/cairn/cairnTargets.cmake").read_text()
    m = re.search(r"set_target_properties\(cairn::cairn PROPERTIES(.*?)\n\)", targets, re.S)
    assert m and "INTERFACE_LINK_LIBRARIES" not in m.group(1), targets

    # Every installed program and the library resolve their shared libraries without help.
    for rel in ("bin/cairnd", "bin/cairn", "bin/cairn-sim", f"{LIBDIR}/libcairn.so.0",
                *([f"{LIBDIR}/libcairn_keras_h5.so"] if cache("CAIRN_WITH_HDF5") == "ON" else [])):
        ldd = run(["ldd", prefix / rel]).stdout
        assert "not found" not in ldd and str(BUILD) not in ldd, f"{rel}:\n{ldd}"
    readelf = shutil.which("readelf")
    if readelf:
        dyn = run([readelf, "-d", prefix / "bin/cairn"]).stdout
        assert "$ORIGIN/../" in dyn and str(BUILD) not in dyn, dyn


def test_installed_programs_print_the_project_version(prefix):
    version = project_version()
    from_git = (SOURCE / ".git").exists() and shutil.which("git") is not None
    for prog in ("cairn", "cairnd", "cairn-sim"):
        out = run([prefix / "bin" / prog, "--version"]).stdout.strip()
        m = re.fullmatch(rf"{re.escape(prog)} {re.escape(version)}( \(git [0-9a-f]{{4,}}\))?", out)
        assert m, f"{prog} --version printed {out!r}"
        assert bool(m.group(1)) == from_git, f"{prog} --version printed {out!r}; built from git: {from_git}"


def test_outside_cmake_project_finds_cairn_and_runs_against_the_installed_daemon(prefix, daemon, tmp):
    src, build = tmp / "cmake-consumer", tmp / "cmake-consumer-build"
    src.mkdir()
    major_minor = ".".join(project_version().split(".")[:2])
    (src / "CMakeLists.txt").write_text(CMAKE_PROJECT.format(version=major_minor))
    (src / "client.c").write_text(C_CLIENT)
    (src / "client.cpp").write_text(CPP_CLIENT)
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    run([CMAKE, "-S", src, "-B", build, *gen, f"-DCMAKE_PREFIX_PATH={prefix}",
         "-DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF"])
    assert f"cairn_DIR:PATH={prefix / LIBDIR / 'cmake/cairn'}" in (build / "CMakeCache.txt").read_text()
    run([CMAKE, "--build", build])
    assert run([build / "c_client"], env=daemon.env).stdout == "c ok\n"
    assert run([build / "cpp_client"], env=daemon.env).stdout == "c++ ok\n"

    # A version the package is not compatible with is refused.
    (src / "CMakeLists.txt").write_text(CMAKE_PROJECT.format(version="99.0"))
    r = subprocess.run([CMAKE, "-S", src, "-B", tmp / "cmake-consumer-99", *gen, f"-DCMAKE_PREFIX_PATH={prefix}"],
                       capture_output=True, text=True, env=clean_env(), timeout=300)
    assert r.returncode != 0 and "99.0" in r.stderr, r.stderr


def test_outside_project_builds_with_pkg_config_and_runs_against_the_installed_daemon(prefix, daemon, tmp):
    src = tmp / "pc-consumer"
    src.mkdir()
    (src / "client.c").write_text(C_CLIENT)
    (src / "client.cpp").write_text(CPP_CLIENT)
    env = clean_env(PKG_CONFIG_PATH=str(prefix / LIBDIR / "pkgconfig"))
    assert run(["pkg-config", "--modversion", "cairn"], env=env).stdout.strip() == project_version()
    flags = run(["pkg-config", "--cflags", "--libs", "cairn"], env=env).stdout.split()
    assert str(prefix) in " ".join(flags) and str(BUILD) not in " ".join(flags), flags
    run(["cc", "-std=c99", "-Wall", "-Werror", src / "client.c", "-o", src / "c_client", *flags], env=env)
    run(["c++", "-std=c++17", "-Wall", "-Werror", src / "client.cpp", "-o", src / "cpp_client", *flags], env=env)
    assert run([src / "c_client"], env=daemon.env).stdout == "c ok\n"
    assert run([src / "cpp_client"], env=daemon.env).stdout == "c++ ok\n"


def test_installed_python_package_loads_the_installed_library(prefix, daemon, tmp):
    pytest.importorskip("numpy")
    script = ("import cairn, numpy as np\n"
              "c = cairn.connect()\n"
              "c.put_tensor('install/py', np.arange(5, dtype=np.int32))\n"
              "assert (c.get_tensor('install/py') == np.arange(5)).all()\n"
              "print(cairn.__file__)\n"
              "print(cairn._ffi.library_path())\n")
    env = dict(daemon.env, PYTHONPATH=str(prefix / PYTHONDIR))
    out = run([sys.executable, "-c", script], env=env, cwd=tmp).stdout.splitlines()
    package, library = Path(out[0]), Path(out[1])
    assert package == prefix / PYTHONDIR / "cairn" / "__init__.py", out
    assert library.resolve().parent == (prefix / LIBDIR).resolve(), out


@pytest.mark.skipif(cache("CAIRN_WITH_HDF5") != "ON", reason="cairn built without HDF5 (CAIRN_WITH_HDF5=OFF)")
def test_installed_python_package_does_keras_h5_through_the_installed_converter(prefix, daemon, tmp):
    pytest.importorskip("numpy")
    script = ("import os, cairn, numpy as np\n"
              "c = cairn.connect()\n"
              "c.save_model('install-h5', {'dense.kernel': np.arange(6, dtype=np.float32).reshape(2, 3)})\n"
              "cairn.export_file(c, 'install-h5', 'm.h5')\n"
              "cairn.import_file(c, 'install-h5-back', 'm.h5')\n"
              "back = c.load_model('install-h5-back', copy=True)\n"
              "assert (back['dense.kernel'] == np.arange(6).reshape(2, 3)).all(), back\n"
              "print(cairn.io._keras_h5_lib._name)\n")
    # No `cairn` on PATH: the package reaches HDF5 through the library only.
    bare = tmp / "bare-bin"
    bare.mkdir(exist_ok=True)
    env = dict(daemon.env, PYTHONPATH=str(prefix / PYTHONDIR), PATH=str(bare))
    out = run([sys.executable, "-c", script], env=env, cwd=tmp).stdout.splitlines()
    assert Path(out[-1]).resolve() == (prefix / LIBDIR / "libcairn_keras_h5.so").resolve(), out


def test_installed_tool_imports_pt_with_the_python_it_is_given_and_the_installed_package(prefix, daemon, tmp):
    torch = pytest.importorskip("torch")
    # $CAIRN_PYTHON is a shim that records the package path it is run with, then runs this Python.
    shim = tmp / "python-shim"
    seen = tmp / "shim-pythonpath"
    shim.write_text(f"#!/bin/sh\nprintf '%s' \"$PYTHONPATH\" > '{seen}'\nexec '{sys.executable}' \"$@\"\n")
    shim.chmod(0o755)
    sd = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4), "b": torch.ones(4, dtype=torch.bfloat16)}
    torch.save(sd, tmp / "m.pt")
    env = dict(daemon.env, CAIRN_PYTHON=str(shim))
    cairn = prefix / "bin" / "cairn"
    run([cairn, "import", "install-pt", tmp / "m.pt"], env=env)
    assert [os.path.normpath(p) for p in seen.read_text().split(":")] == [str(prefix / PYTHONDIR)]
    run([cairn, "export", "install-pt", tmp / "back.pt"], env=env)
    back = torch.load(tmp / "back.pt", weights_only=True)
    assert list(back) == list(sd) and all(torch.equal(back[k], v) and back[k].dtype == v.dtype for k, v in sd.items())
