"""The Spack package (spack/packages/cairn/package.py) installs cairn from this checkout, offline.

The trimmed offline Spack 0.23 kit (../shared/vendor/spack, or $CAIRN_SPACK_KIT_SRC) is set up once
into a cache outside the checkout ($CAIRN_SPACK_KIT, default /var/cache/cairn/spack-kit) and reused
while the kit and the Debian packages it declares as externals are unchanged. The test then, in a
throw-away Spack environment (its spack.yaml names this checkout's package repository, so nothing
outside the cache and a temporary directory is configured):
  - concretizes cairn@=main+mpi+libfabric+hdf5 with test dependencies (every dependency must be an
    external: nothing is fetched);
  - installs it from a snapshot of the checkout (dev_path) with `--test=root`, which runs the unit
    tests in Spack's check phase;
  - runs the installed `cairn --version`, and `spack test run cairn` (the package's stand-alone
    tests: `cairn --version`, `cairnd --version`, a C client built against the installed tree).
Only the absence of the kit skips; a failed setup, concretization, build or test fails.

The build works on a snapshot (git's tracked and untracked, not ignored files) copied into the
cache, not on the checkout itself: Spack links `build-<arch>-<hash>` into a dev_path source
directory, and others may be editing the checkout while it builds. Each step's time is printed
(`pytest -s`) and written to $CAIRN_SPACK_KIT/last-test-times.json.
"""
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time

import pytest

SOURCE = os.environ.get("CAIRN_SOURCE_DIR",
                        os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
# The vendored kit: $CAIRN_SPACK_KIT_SRC, else ../shared/vendor/spack beside the checkout, else /work/shared.
KIT_SRC = next((k for k in (os.environ.get("CAIRN_SPACK_KIT_SRC"), os.path.join(SOURCE, "..", "shared", "vendor", "spack"),
                            "/work/shared/vendor/spack") if k and os.path.exists(os.path.join(k, "setup.sh"))),
               os.path.join(SOURCE, "..", "shared", "vendor", "spack"))
KIT = os.environ.get("CAIRN_SPACK_KIT", "/var/cache/cairn/spack-kit")
SPEC = "cairn@=main+mpi+libfabric+hdf5"
JOBS = os.environ.get("CAIRN_SPACK_JOBS", "2")

# The Debian packages whose versions the kit's setup.sh writes into its externals (setup.sh's list):
# when one of them changes, the kit is set up again.
KIT_DEBS = ("cmake ninja-build pkgconf make libyaml-cpp-dev nlohmann-json3-dev libxxhash-dev libspdlog-dev "
            "libfmt-dev libcli11-dev catch2 liburing-dev libhdf5-dev hdf5-helpers libfabric-dev "
            "libopenmpi-dev openmpi-bin libboost-dev googletest libgtest-dev libbenchmark-dev python3-numpy "
            "pybind11-dev libssl-dev gcc g++").split()
DEPS_HINT = "(scripts/deps installs the Debian packages the kit uses as externals)"


def run(cmd, timeout, env=None, cwd=None):
    """Runs cmd; returns (CompletedProcess, seconds). Output is captured (stderr into stdout)."""
    t0 = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                       timeout=timeout, env=env, cwd=cwd)
    return p, time.monotonic() - t0


def tail(text, n=4000):
    return text[-n:]


def kit_stamp():
    """What the kit's setup depends on: its files, and the Debian packages it turns into externals."""
    h = hashlib.sha256()
    for name in sorted(os.listdir(KIT_SRC)):
        path = os.path.join(KIT_SRC, name)
        if os.path.isfile(path):
            st = os.stat(path)
            h.update(("%s %d %d\n" % (name, st.st_size, int(st.st_mtime))).encode())
    dpkg = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${Version} ${Status}\n"] + KIT_DEBS,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, universal_newlines=True)
    h.update(dpkg.stdout.encode())
    h.update(str(os.path.exists("/usr/local/cuda/bin/nvcc") or bool(shutil.which("nvcc"))).encode())
    return h.hexdigest()


def spack_env():
    """The environment $KIT/env.sh sets up (without sourcing setup-env.sh: only the `spack` command
    is run here)."""
    env = dict(os.environ)
    env.update({
        "SPACK_KIT_ROOT": KIT,
        "SPACK_ROOT": os.path.join(KIT, "spack"),
        "SPACK_PYTHON": os.path.join(KIT, "venv", "bin", "python"),
        "SPACK_USER_CONFIG_PATH": os.path.join(KIT, "config"),
        "SPACK_SYSTEM_CONFIG_PATH": os.path.join(KIT, "system-config"),
        "SPACK_USER_CACHE_PATH": os.path.join(KIT, "cache"),
    })
    env.pop("SPACK_DISABLE_LOCAL_CONFIG", None)  # set to anything, it drops the kit's config scope
    env.pop("SPACK_ENV", None)
    return env


def setup_kit(times):
    """Sets the kit up into KIT unless it is already set up from the same kit and Debian packages."""
    if not os.path.isfile(os.path.join(KIT_SRC, "setup.sh")):
        pytest.skip("the offline Spack kit is not here (%s; set $CAIRN_SPACK_KIT_SRC to its directory)"
                    % os.path.abspath(KIT_SRC))
    stamp_file = os.path.join(KIT, ".cairn-kit-stamp")
    stamp = kit_stamp()
    ready = (os.access(os.path.join(KIT, "spack", "bin", "spack"), os.X_OK)
             and os.path.isfile(os.path.join(KIT, "config", "packages.yaml"))
             and os.path.isfile(stamp_file) and open(stamp_file).read().strip() == stamp)
    if ready:
        times["setup"] = 0.0
        return
    if os.path.exists(stamp_file):
        os.unlink(stamp_file)
    # --no-apt: Debian packages are scripts/deps' job; --no-check: the first `spack` run below
    # builds the package index anyway.
    p, secs = run(["bash", os.path.join(KIT_SRC, "setup.sh"), "--no-apt", "--no-check", KIT], timeout=900)
    times["setup"] = round(secs, 1)
    assert p.returncode == 0, "setting up the Spack kit into %s failed %s:\n%s" % (KIT, DEPS_HINT, tail(p.stdout))
    with open(stamp_file, "w") as f:
        f.write(stamp + "\n")


def openssl_external():
    """The kit declares no openssl external; cairn needs libcrypto. Debian's libssl-dev is it."""
    p = subprocess.run(["dpkg-query", "-W", "-f", "${Version} ${Status}", "libssl-dev"],
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, universal_newlines=True)
    assert p.returncode == 0 and p.stdout.endswith("install ok installed"), \
        "libssl-dev is not installed %s" % DEPS_HINT
    version = re.sub(r"^[0-9]+:", "", p.stdout.split()[0])
    return re.sub(r"[-+~].*$", "", version)


def snapshot(dest):
    """Copies the checkout's tracked and untracked, not ignored files into dest (fresh)."""
    if os.path.lexists(dest):
        shutil.rmtree(dest)
    os.makedirs(dest)
    if os.path.isdir(os.path.join(SOURCE, ".git")) or os.path.isfile(os.path.join(SOURCE, ".git")):
        p = subprocess.run(["git", "-C", SOURCE, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           stdout=subprocess.PIPE, check=True)
        names = sorted(set(n for n in p.stdout.decode().split("\0") if n))
    else:  # a source tarball: everything but build trees
        names = []
        for root, dirs, files in os.walk(SOURCE):
            dirs[:] = [d for d in dirs if not d.startswith("build") and d not in (".venv", "__pycache__")]
            names += [os.path.relpath(os.path.join(root, f), SOURCE) for f in files]
    for name in names:
        src = os.path.join(SOURCE, name)
        if not os.path.lexists(src):  # deleted in the working tree, not yet in git
            continue
        os.makedirs(os.path.join(dest, os.path.dirname(name)), exist_ok=True)
        shutil.copy2(src, os.path.join(dest, name), follow_symlinks=False)


SPACK_BUILD_LINK = re.compile(r"^build-linux-.*-[a-z0-9]{7}$")  # Spack's dev_path build link


def spack_links(directory):
    return {n for n in os.listdir(directory) if SPACK_BUILD_LINK.match(n)}


def test_spack_install_with_tests_mpi_libfabric_hdf5():
    times = {}
    setup_kit(times)
    spack = [os.path.join(KIT, "spack", "bin", "spack")]
    env = spack_env()
    links_before = spack_links(SOURCE)

    src = os.path.join(KIT, "src", "cairn")
    t0 = time.monotonic()
    snapshot(src)
    times["snapshot"] = round(time.monotonic() - t0, 1)

    work = tempfile.mkdtemp(prefix="cairn-spack-")
    envdir = os.path.join(work, "env")
    os.makedirs(envdir)
    try:
        # A throw-away environment: the repository, the openssl external, the stage and the job
        # count live in its spack.yaml; the kit's own config scope is left as setup.sh wrote it.
        with open(os.path.join(envdir, "spack.yaml"), "w") as f:
            json.dump({"spack": {
                "specs": ["%s dev_path=%s" % (SPEC, src)],
                "view": False,
                "repos": [os.path.join(SOURCE, "spack")],
                "packages": {"openssl": {"buildable": False, "externals": [
                    {"spec": "openssl@%s" % openssl_external(), "prefix": "/usr"}]}},
                "config": {"build_stage": [os.path.join(work, "stage")], "build_jobs": int(JOBS),
                           "test_stage": os.path.join(work, "test-stage")},
            }}, f, indent=1)
        in_env = spack + ["-e", envdir]

        # A previous run's install has the same hash (same spec, same dev_path): remove it, so that
        # this run builds and checks the current sources.
        run(spack + ["uninstall", "-y", "-a", "cairn"], timeout=300, env=env)

        p, secs = run(in_env + ["concretize", "--test", "root"], timeout=600, env=env)
        times["concretize"] = round(secs, 1)
        assert p.returncode == 0, "spack concretize failed %s:\n%s" % (DEPS_HINT, tail(p.stdout))
        # Everything but cairn itself and gcc-runtime is a Debian external: nothing is fetched.
        built = [l for l in p.stdout.splitlines() if re.match(r"^ - +\^?[a-z]", l)]
        assert any(re.search(r" cairn@", l) for l in built), "cairn is not to be built:\n" + tail(p.stdout)
        assert all(re.search(r"\^?(cairn|gcc-runtime)@", l) for l in built), \
            "not every dependency is an external %s:\n%s" % (DEPS_HINT, "\n".join(built))
        assert "catch2" in p.stdout, "--test root did not bring in catch2:\n" + tail(p.stdout)

        p, secs = run(in_env + ["install", "-v", "--test", "root", "-j", JOBS], timeout=2400, env=env)
        times["install"] = round(secs, 1)
        assert p.returncode == 0, "spack install --test=root %s failed:\n%s" % (SPEC, tail(p.stdout, 8000))
        m = re.search(r"Total Test time \(real\) = +([0-9.]+) sec", p.stdout)
        assert m, "the check phase (ctest -R ^unit_) did not run:\n" + tail(p.stdout)
        times["check (ctest unit_*)"] = float(m.group(1))
        assert re.search(r"100% tests passed, 0 tests failed out of [1-9]", p.stdout), tail(p.stdout)

        p, _ = run(in_env + ["location", "-i", "cairn"], timeout=300, env=env)
        assert p.returncode == 0, p.stdout
        prefix = p.stdout.strip().splitlines()[-1]
        try:  # Spack's phase times: cmake, build (the check phase runs at its end), install
            with open(os.path.join(prefix, ".spack", "install_times.json")) as f:
                for phase in json.load(f)["phases"]:
                    if phase["name"] in ("cmake", "build", "install"):
                        times["phase " + phase["name"]] = round(phase["seconds"], 1)
        except (OSError, ValueError, KeyError):
            pass
        p, _ = run([os.path.join(prefix, "bin", "cairn"), "--version"], timeout=30)
        assert p.returncode == 0 and p.stdout.startswith("cairn "), \
            "the installed `cairn --version` failed (%d): %s" % (p.returncode, p.stdout)
        times["cairn --version"] = p.stdout.strip()

        p, secs = run(in_env + ["test", "run", "cairn"], timeout=600, env=env)
        times["spack test run"] = round(secs, 1)
        assert p.returncode == 0 and "1 passed of 1 spec" in p.stdout, \
            "spack test run cairn failed:\n" + tail(p.stdout)
    finally:
        run(spack + ["test", "remove", "-y"], timeout=120, env=env)
        shutil.rmtree(work, ignore_errors=True)
        # Spack links build-<arch>-<hash> into a dev_path source; the snapshot holds it, but should
        # the checkout ever get one, remove what this run added (never others' build directories).
        for name in spack_links(src):  # dangles once the stage is gone
            if os.path.islink(os.path.join(src, name)):
                os.unlink(os.path.join(src, name))
        for name in spack_links(SOURCE) - links_before:
            path = os.path.join(SOURCE, name)
            if os.path.islink(path):
                os.unlink(path)
            else:
                shutil.rmtree(path, ignore_errors=True)
        print("spack test times (s): " + json.dumps(times))
        try:
            with open(os.path.join(KIT, "last-test-times.json"), "w") as f:
                json.dump(times, f, indent=1)
        except OSError:
            pass
