// The bridge to Python for PyTorch files: `cairn import/export` of .pt/.pth/.bin runs cairn.io's
// command line once (python_io.hpp).
#include "tools/python_io.hpp"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/self_path.hpp"

extern char** environ;

namespace cairn::tool {

namespace {

// The interpreter: $CAIRN_PYTHON, else the one this tool was built with while it is still there
// (a Python first on PATH, pyenv's or conda's, may lack torch and numpy), else `python3` on PATH.
std::string python_interpreter() {
  const char* env_python = std::getenv("CAIRN_PYTHON");
  if (env_python && *env_python) return env_python;
#ifdef CAIRN_BUILD_PYTHON
  if (::access(CAIRN_BUILD_PYTHON, X_OK) == 0) return CAIRN_BUILD_PYTHON;
#endif
  return "python3";
}

// Run by the interpreter as `-c`, with sys.argv = ["-c", INTERPRETER, VERB, ID, FILE, ...]. It checks
// what the file needs before importing cairn.io, so that a Python without it fails with one line.
// `-c` rather than `-m cairn.io`: the package imports cairn.io, and runpy warns about that.
constexpr const char* kPythonMain = R"(import sys
python = sys.argv.pop(1)
if "/" not in python:
    python = sys.executable or python
what = "%s of %s" % (sys.argv[1], sys.argv[3]) if len(sys.argv) > 3 else "cairn.io"
for mod, name in (("torch", "PyTorch"), ("numpy", "NumPy")):
    try:
        __import__(mod)
    except ModuleNotFoundError as e:
        if e.name != mod:
            raise
        sys.stderr.write("cairn: %s needs %s, but %s has no module '%s' (pip install %s, or set CAIRN_PYTHON "
                         "to a Python that has it)\n" % (what, name, python, mod, mod))
        sys.exit(1)
try:
    from cairn.io import _main
except ModuleNotFoundError as e:
    if e.name != "cairn" and e.name != "cairn.io":
        raise
    sys.stderr.write("cairn: %s: %s cannot find the Python package cairn (set PYTHONPATH to its parent "
                     "directory)\n" % (what, python))
    sys.exit(1)
sys.exit(_main(sys.argv[1:]))
)";

}  // namespace

Result<int> run_python_io(const std::vector<std::string>& args) {
  std::string python = python_interpreter();
  std::string dir = executable_dir();
  // The library next to this tool (build tree: bin/cairn, lib/libcairn.so) unless one is chosen.
  const char* lib = std::getenv("CAIRN_LIBRARY");
  if (!lib || !*lib) {
    for (const char* rel : {"/../lib/libcairn.so", "/../lib/libcairn.so.0"}) {
      if (!dir.empty() && is_regular_file(dir + rel)) {
        ::setenv("CAIRN_LIBRARY", (dir + rel).c_str(), 1);
        break;
      }
    }
  }
  // The Python package, after whatever PYTHONPATH already provides: installed beside this tool
  // (<prefix>/bin/../lib/python3/dist-packages; it finds the installed libcairn.so itself), else the
  // package of this source tree.
  std::string package_dir;
#ifdef CAIRN_INSTALLED_PYTHON_RELDIR
  if (!dir.empty() && is_regular_file(dir + "/" CAIRN_INSTALLED_PYTHON_RELDIR "/cairn/_installed.py"))
    package_dir = dir + "/" CAIRN_INSTALLED_PYTHON_RELDIR;
#endif
#ifdef CAIRN_PYTHON_PACKAGE_DIR
  std::string source_io(CAIRN_PYTHON_PACKAGE_DIR);
  source_io.append("/cairn/io.py");
  if (package_dir.empty() && is_regular_file(source_io)) package_dir = CAIRN_PYTHON_PACKAGE_DIR;
#endif
  if (!package_dir.empty()) {
    const char* pp = std::getenv("PYTHONPATH");
    std::string v = pp && *pp ? std::string(pp) + ":" + package_dir : package_dir;
    ::setenv("PYTHONPATH", v.c_str(), 1);
  }
  std::vector<std::string> argv_s{python, "-c", kPythonMain, python};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid;
  int rc = ::posix_spawnp(&pid, python.c_str(), nullptr, nullptr, argv.data(), environ);
  if (rc != 0)
    return invalid_argument("cannot run Python ('" + python + "': " + std::strerror(rc) +
                            "); .pt/.bin files need Python 3 with PyTorch (set CAIRN_PYTHON to its interpreter)");
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return errno_status("waiting for " + python, errno);
  }
  if (WIFSIGNALED(status))
    return internal_error("'" + python + "' was killed by signal " + std::to_string(WTERMSIG(status)));
  return WEXITSTATUS(status);
}

}  // namespace cairn::tool
