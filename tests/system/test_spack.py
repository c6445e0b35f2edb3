"""The Spack package (spack/packages/cairn/package.py) installs cairn from this checkout with the
site's Spack.

Needs a Spack the site has installed: $CAIRN_SPACK (the spack executable, or a Spack root holding
bin/spack), else `spack` on PATH; without either the test skips, saying so. Spack is not packaged by
Debian, and this project never sets one up. $CAIRN_SPACK_JOBS, when set, is the build's job count
(else the site's configuration decides).

With that Spack, in a throw-away Spack environment in a temporary directory (its spack.yaml adds this
checkout's package repository, spack/, and puts the stage there; everything else is the site's
configuration, externals included), the test
  - concretizes cairn@=main+mpi+libfabric+hdf5 with test dependencies;
  - installs it from a snapshot of the checkout (dev_path) with `--test=root`, which runs the unit
    tests in Spack's check phase;
  - runs the installed `cairn --version`, and `spack test run cairn` (the package's stand-alone
    tests: `cairn --version`, `cairnd --version`, a C client built against the installed tree);
  - uninstalls that cairn again (only it: the snapshot's dev_path makes its hash this run's own).
Only the absence of Spack skips. A failed concretization, build or test fails, with Spack's output;
so does a dependency Spack cannot fetch on a machine without network (declare it as an external, or
install it, in the site's Spack).

The build works on a snapshot (git's tracked and untracked, not ignored files) copied into the
temporary directory, not on the checkout itself: Spack links `build-<arch>-<hash>` into a dev_path
source directory, and others may be editing the checkout while it builds. Each step's time is printed
(`pytest -s`) and written to times.json in the temporary directory (pytest's tmp_path, kept for
pytest's last three runs); the snapshot and the stage are removed when the test passes.
"""
import json
import os
import re
import shutil
import subprocess
import time

import pytest

SOURCE = os.environ.get("CAIRN_SOURCE_DIR",
                        os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
SPEC = "cairn@=main+mpi+libfabric+hdf5"
JOBS = os.environ.get("CAIRN_SPACK_JOBS")  # None: the site's build_jobs

OFFLINE_HINT = ("on a machine without network, every dependency Spack would build must be installed "
                "or declared as an external in the site's Spack (spack external find --not-buildable NAME)")


def run(cmd, timeout, env=None, cwd=None):
    """Runs cmd; returns (CompletedProcess, seconds). Output is captured (stderr into stdout)."""
    t0 = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                       timeout=timeout, env=env, cwd=cwd)
    return p, time.monotonic() - t0


def tail(text, n=4000):
    return text[-n:]


def site_spack():
    """The site's spack: $CAIRN_SPACK, else PATH. Skips when neither names one; fails when
    $CAIRN_SPACK is set but holds no spack (a misconfiguration, not an absence)."""
    given = os.environ.get("CAIRN_SPACK")
    if given:
        for exe in (given, os.path.join(given, "bin", "spack")):
            if os.path.isfile(exe) and os.access(exe, os.X_OK):
                return os.path.abspath(exe)
        pytest.fail("CAIRN_SPACK=%s is neither the spack executable nor a Spack root holding bin/spack" % given)
    exe = shutil.which("spack")
    if not exe:
        pytest.skip("Spack is not installed: no spack on PATH and CAIRN_SPACK is not set (Spack is not "
                    "packaged by Debian; install it from its own source and put spack on PATH)")
    return exe


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
# A node `spack concretize` lists as not installed yet (" - "; "[+]", "[^]", "[e]" are installed,
# upstream, external), with an optional short hash before the name.
TO_BUILD = re.compile(r"^ - +(?:[a-z0-9]{7} +)?\^?([a-z0-9][a-z0-9-]*)@")


def spack_links(directory):
    return {n for n in os.listdir(directory) if SPACK_BUILD_LINK.match(n)}


def test_spack_install_with_tests_mpi_libfabric_hdf5(tmp_path):
    spack = [site_spack()]
    env = dict(os.environ)
    env.pop("SPACK_ENV", None)  # `-e` names the environment; an activated one plays no part
    times = {}
    p, _ = run(spack + ["--version"], timeout=120, env=env)
    assert p.returncode == 0, "`%s --version` failed:\n%s" % (spack[0], tail(p.stdout))
    times["spack --version"] = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""

    work = str(tmp_path)
    src = os.path.join(work, "src", "cairn")
    stage = os.path.join(work, "stage")
    envdir = os.path.join(work, "env")
    times_file = os.path.join(work, "times.json")
    links_before = spack_links(SOURCE)
    t0 = time.monotonic()
    snapshot(src)
    times["snapshot"] = round(time.monotonic() - t0, 1)

    os.makedirs(envdir)
    config = {"build_stage": [stage], "test_stage": os.path.join(work, "test-stage")}
    if JOBS:
        config["build_jobs"] = int(JOBS)
    # A throw-away environment: the repository, the stage and the job count live in its spack.yaml;
    # the site's configuration scopes (externals, compilers, install tree) are read, never written.
    with open(os.path.join(envdir, "spack.yaml"), "w") as f:
        json.dump({"spack": {
            "specs": ["%s dev_path=%s" % (SPEC, src)],
            "view": False,
            "repos": [os.path.join(SOURCE, "spack")],
            "config": config,
        }}, f, indent=1)
    in_env = spack + ["-e", envdir]
    installed = False
    passed = False
    try:
        p, secs = run(in_env + ["concretize", "--test", "root"], timeout=900, env=env)
        times["concretize"] = round(secs, 1)
        assert p.returncode == 0, \
            "the site's Spack (%s) could not concretize %s (%s):\n%s" % (spack[0], SPEC, OFFLINE_HINT, tail(p.stdout))
        to_build = [m.group(1) for m in map(TO_BUILD.match, p.stdout.splitlines()) if m]
        assert "cairn" in to_build, "cairn is not to be built:\n" + tail(p.stdout)
        assert "catch2" in p.stdout, "--test root did not bring in catch2:\n" + tail(p.stdout)
        others = sorted(set(to_build) - {"cairn"})
        times["built besides cairn"] = " ".join(others)

        install = in_env + ["install", "-v", "--test", "root"] + (["-j", JOBS] if JOBS else [])
        installed = True  # from here on the finally uninstalls (harmless when nothing got installed)
        p, secs = run(install, timeout=2400, env=env)
        times["install"] = round(secs, 1)
        if p.returncode != 0 and others and re.search(r"FetchError|[Ff]ailed to fetch|[Uu]nable to fetch", p.stdout):
            pytest.fail("spack install %s could not fetch a dependency it builds besides cairn (%s): %s:\n%s"
                        % (SPEC, " ".join(others), OFFLINE_HINT, tail(p.stdout, 8000)))
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
        passed = True
    finally:
        if installed:
            # In an environment, uninstall matches only the environment's specs: this run's cairn.
            p, _ = run(in_env + ["uninstall", "-y", "cairn"], timeout=300, env=env)
            if p.returncode != 0 and not re.search(r"does not match any|matches no installed", p.stdout):
                print("spack uninstall of this run's cairn failed:\n" + tail(p.stdout, 2000))
        # Spack links build-<arch>-<hash> into a dev_path source: the snapshot holds it, but should
        # the checkout ever get one, remove what this run added (never others' build directories).
        for name in spack_links(SOURCE) - links_before:
            path = os.path.join(SOURCE, name)
            if os.path.islink(path):
                os.unlink(path)
            else:
                shutil.rmtree(path, ignore_errors=True)
        if passed:  # on failure they stay, for the build log Spack names (pytest keeps three runs)
            shutil.rmtree(src, ignore_errors=True)
            shutil.rmtree(stage, ignore_errors=True)
        print("spack test times (s), also in %s: %s" % (times_file, json.dumps(times)))
        with open(times_file, "w") as f:
            json.dump(times, f, indent=1)
