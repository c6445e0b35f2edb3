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


def _pkg_config_flags(daemon):
    env = dict(daemon.env)
    env["PKG_CONFIG_PATH"] = f"{BUILD / 'pkgconfig'}"
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "cairn"], env=env, capture_output=True, text=True,
                           check=True).stdout.split()
    return env, flags


_STRICT_C = ["cc", "-std=c99", "-Wall", "-Wextra", "-pedantic", "-Werror"]


def test_program_of_the_design_s_calls_builds_and_runs_unchanged(daemon, tmp):
    """tests/c/contract_test.c uses only the calls ARCHITECTURE.md fixes, as written there: it builds
    with -Werror (no deprecation warning) as an outside user builds it, and passes."""
    env, flags = _pkg_config_flags(daemon)
    sanitize = ["-fsanitize=address,undefined"] if os.environ.get("CAIRN_SANITIZED") == "1" else []
    exe = tmp / "contract"
    subprocess.run([*_STRICT_C, *sanitize, "-o", str(exe), str(SOURCE / "tests" / "c" / "contract_test.c"), *flags],
                   check=True, env=env)
    for program in (exe, BUILD / "bin" / "contract_test"):
        r = subprocess.run([str(program), f"-{program.name}"], env=daemon.env, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "0 failed" in r.stdout


def test_deprecated_names_still_work(daemon):
    r = subprocess.run([str(BUILD / "bin" / "deprecated_test")], env=daemon.env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 failed" in r.stdout


# Each deprecated C name and the replacement its warning names (docs/api.md).
_DEPRECATED = {
    "cairn_unpack_tensor_alloc": "cairn_tensor_unpack_alloc",
    "cairn_model_commit_pipelined": "cairn_model_commit_opts",
    "cairn_model_read_tensors": "cairn_model_read",
    "cairn_model_map_tensors": "cairn_model_map",
    "cairn_model_map_tensors_private": "cairn_model_map with private_copy",
    "cairn_model_map_tensor_device": "cairn_model_map with kind = CAIRN_MEM_CUDA",
    "cairn_model_map_tensors_device": "cairn_model_map with kind = CAIRN_MEM_CUDA",
    "cairn_model_read_tensors_device": "cairn_model_read with kind = CAIRN_MEM_CUDA",
    "cairn_prefetch_all": "cairn_model_prefetch with all",
}
_SYNONYMS = {
    "cairn_put_tensor": "cairn_tensor_put",
    "cairn_poll_tensor": "cairn_tensor_poll",
    "cairn_delete_tensor": "cairn_tensor_delete",
    "cairn_prefetch": "cairn_model_prefetch",
}


def test_deprecated_names_warn_naming_the_replacement(tmp):
    """With -Werror a deprecated call stops the build, and the message names what to use; the
    synonyms the design fixes warn only when the program asks (CAIRN_WARN_SYNONYMS)."""
    src = SOURCE / "tests" / "c" / "deprecated_test.c"
    base = [*_STRICT_C, f"-I{SOURCE / 'include'}", "-fsyntax-only", str(src)]
    env = {**os.environ, "LC_ALL": "C"}  # plain quotes in the compiler's messages
    r = subprocess.run(base, capture_output=True, text=True, env=env)
    assert r.returncode != 0
    for old, new in _DEPRECATED.items():
        assert f"'{old}' is deprecated: use {new}" in r.stderr, (old, r.stderr)
    for old in _SYNONYMS:
        assert f"'{old}' is deprecated" not in r.stderr
    r = subprocess.run([*base, "-DCAIRN_WARN_SYNONYMS"], capture_output=True, text=True, env=env)
    for old, new in _SYNONYMS.items():
        assert f"'{old}' is deprecated: use {new}" in r.stderr, (old, r.stderr)


def _c_calls():
    """The calls of cairn.h, without the names kept for compatibility (after its marker)."""
    import re
    text = (SOURCE / "include" / "cairn" / "cairn.h").read_text()
    current = text.split("/* ---- names the design fixes")[0]
    return set(re.findall(r"CAIRN_EXPORT [^;]*?\b(cairn_\w+)\(", current))


def test_cpp_wrapper_covers_the_whole_c_api():
    """client.hpp calls every current C call (the options initialisers are its default arguments;
    cairn_ticket_free is the Ticket's deleter)."""
    import re
    calls = _c_calls()
    assert {"cairn_model_read", "cairn_model_map", "cairn_model_commit_opts", "cairn_tensor_put"} <= calls
    wrapper = (SOURCE / "include" / "cairn" / "client.hpp").read_text()
    missing = sorted(c for c in calls if not c.endswith("_options_init") and not re.search(rf"\b{c}\b", wrapper))
    assert not missing, f"client.hpp has no method for {missing}"
