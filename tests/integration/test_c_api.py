"""The C API from a real C99 program: the ctest-built binary and one compiled here with
pkg-config after `eval "$(scripts/env)"`, as an outside user would."""
import os
import subprocess

from conftest import BUILD, SOURCE


def test_c_api_program(daemon):
    r = subprocess.run([str(BUILD / "bin" / "c_api_test")], env=daemon.env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 failed" in r.stdout


def test_cpp_api_program(daemon):
    r = subprocess.run([str(BUILD / "bin" / "cpp_api_test")], env=daemon.env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 failed" in r.stdout


def test_outside_program_builds_with_pkg_config(daemon, tmp):
    env_lines = subprocess.run([str(SOURCE / "scripts" / "env")], capture_output=True, text=True, check=True).stdout
    # The printed exports refer to build/ under the source tree; in CI that is where the build is.
    env = dict(daemon.env)
    env["PKG_CONFIG_PATH"] = f"{BUILD / 'pkgconfig'}"
    assert "PKG_CONFIG_PATH" in env_lines
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "cairn"], env=env, capture_output=True, text=True,
                           check=True).stdout.split()
    exe = tmp / "outside"
    # A sanitized libcairn needs a sanitized program (the runtime must come first).
    sanitize = ["-fsanitize=address,undefined"] if os.environ.get("CAIRN_SANITIZED") == "1" else []
    subprocess.run(["cc", "-std=c99", "-Wall", "-Wextra", "-pedantic", "-Werror", *sanitize, "-o", str(exe),
                    str(SOURCE / "tests" / "c" / "c_api_test.c"), *flags], check=True, env=env)
    r = subprocess.run([str(exe), "-outside"], env=daemon.env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
