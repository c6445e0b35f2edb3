# Copyright the cairn authors.
#
# The Spack package of cairn (docs/spack.md). It loads in Spack 0.22/0.23 and in Spack 1.x: the
# build-system base classes moved to the `spack_repo.builtin` package in 1.x, and 1.x (not 0.23)
# knows the `c` language virtual, so both are guarded below.

import glob
import os

try:  # Spack 1.x
    from spack_repo.builtin.build_systems.cmake import CMakePackage, generator
    from spack_repo.builtin.build_systems.cuda import CudaPackage

    SPACK_V1 = True
except ImportError:  # Spack 0.2x
    from spack.package import CMakePackage, CudaPackage, generator

    SPACK_V1 = False

from spack.package import *


class Cairn(CMakePackage, CudaPackage):
    """A model cache for HPC deep-learning workflows: one daemon per compute node (cairnd) keeps
    tensors in a shared-memory DRAM arena (and GPU memory, and node-local NVMe) in front of a
    deduplicating repository on the parallel filesystem, knows every model's ancestry, and lets
    local processes read tensors without a copy. Provides cairnd, the cairn tool, libcairn (C and
    C++ API) and, with +python, the Python package."""

    # NOTE: placeholder addresses until the project is published (the checkout has no remote).
    homepage = "https://github.com/cairn-hpc/cairn"
    git = "https://github.com/cairn-hpc/cairn.git"

    # `spack install cairn@main` clones the branch; a local checkout builds with
    # `spack install cairn@=main dev_path=/path/to/checkout` (docs/spack.md).
    version("main", branch="main")

    variant("mpi", default=False, description="MPI bootstrap of the peer group (CAIRN_WITH_MPI)")
    variant(
        "libfabric",
        default=True,
        description="Peer service over libfabric: daemons of a job share chunks (CAIRN_WITH_LIBFABRIC)",
    )
    variant(
        "hdf5",
        default=False,
        description="Keras HDF5 import/export in the cairn tool (CAIRN_WITH_HDF5)",
    )
    variant(
        "python",
        default=False,
        description="Install the Python package (ctypes over libcairn, numpy arrays)",
    )
    variant(
        "tcl",
        default=False,
        description="Tcl package for Swift/T leaf functions (CAIRN_WITH_TCL)",
    )
    variant(
        "fortran",
        default=False,
        description="Fortran module cairn over the C API (CAIRN_WITH_FORTRAN)",
    )
    # `cuda` and `cuda_arch` come from CudaPackage (CAIRN_WITH_CUDA, CMAKE_CUDA_ARCHITECTURES).

    generator("ninja", "make", default="ninja")

    depends_on("cxx", type="build")
    if SPACK_V1:
        depends_on("c", type="build")  # libcairn_mpi, the C API test; Spack 0.23 has no `c` virtual
    depends_on("fortran", type="build", when="+fortran")

    # cmake_minimum_required(VERSION 3.25) in CMakeLists.txt
    depends_on("cmake@3.25:", type="build")
    depends_on("pkgconfig", type="build")

    # find_package(... REQUIRED) / pkg_check_modules(... REQUIRED) in CMakeLists.txt
    depends_on("yaml-cpp@0.6:")
    depends_on("nlohmann-json@3.9:")
    depends_on("spdlog@1.9:")  # fmt comes with spdlog (cairn does not include fmt itself)
    depends_on("cli11@2:")
    depends_on("xxhash@0.8:")  # XXH3 / XXH128
    depends_on("openssl@1.1:")  # libcrypto: HMAC of the peer group
    depends_on("boost@1.74:", type="build")  # header-only Asio + Beast: the metrics endpoint
    # io_uring batches file I/O; CMake finds it when present (without it, pread/pwrite loops).
    depends_on("liburing@2:", when="platform=linux")
    depends_on("catch2@2.11:2", type="test")  # find_package(Catch2 2) for the unit tests

    depends_on("mpi", when="+mpi")
    depends_on("libfabric@1.11:", when="+libfabric")
    depends_on("hdf5@1.10:", when="+hdf5")  # the C API only; serial or parallel HDF5 both work
    depends_on("cuda@11:", when="+cuda")
    depends_on("tcl@8.6:", when="+tcl")

    with when("+python"):
        extends("python")
        depends_on("python@3.8:", type=("build", "run"))
        depends_on("py-numpy@1.20:", type=("build", "run"))

    conflicts("%gcc@:9", msg="cairn is C++20: use GCC 10 or newer")
    conflicts("%clang@:11", msg="cairn is C++20: use Clang 12 or newer")
    conflicts("platform=darwin", msg="cairn needs Linux (shared memory, Unix sockets, io_uring)")
    conflicts("platform=windows", msg="cairn needs Linux (shared memory, Unix sockets, io_uring)")

    def cmake_args(self):
        spec = self.spec
        args = [
            # CAIRN_BUILD_TESTS is cairn's switch; BUILD_TESTING is CTest's usual one.
            self.define("CAIRN_BUILD_TESTS", self.run_tests),
            self.define("BUILD_TESTING", self.run_tests),
            self.define("CAIRN_BUILD_BENCH", False),
            self.define("CAIRN_FUZZ", False),
            self.define("CAIRN_SANITIZE", False),
            self.define("CAIRN_WERROR", False),
            # Every optional part is set explicitly: CMakeLists.txt would otherwise turn on what it
            # happens to find on the build machine.
            self.define_from_variant("CAIRN_WITH_MPI", "mpi"),
            self.define_from_variant("CAIRN_WITH_LIBFABRIC", "libfabric"),
            self.define_from_variant("CAIRN_WITH_HDF5", "hdf5"),
            self.define_from_variant("CAIRN_WITH_CUDA", "cuda"),
            self.define_from_variant("CAIRN_WITH_TCL", "tcl"),
            self.define_from_variant("CAIRN_WITH_FORTRAN", "fortran"),
        ]
        if spec.satisfies("+mpi"):
            args.append(self.define("MPI_C_COMPILER", spec["mpi"].mpicc))
        if spec.satisfies("+cuda"):
            args.append(self.define("CUDAToolkit_ROOT", spec["cuda"].prefix))
            cuda_arch = spec.variants["cuda_arch"].value
            if cuda_arch and cuda_arch[0] != "none":
                args.append(self.define("CMAKE_CUDA_ARCHITECTURES", ";".join(sorted(cuda_arch))))
        if spec.satisfies("+tcl"):
            # CMakeLists.txt looks only in Debian's paths unless told where Tcl is.
            tcl = spec["tcl"].prefix
            version = spec["tcl"].version.up_to(2)
            for include in (join_path(tcl.include, f"tcl{version}"), tcl.include):
                if os.path.exists(join_path(include, "tcl.h")):
                    args.append(self.define("CAIRN_TCL_INCLUDE_DIR", include))
                    break
            # lib/, lib64/ or a multiarch lib/<triplet>/ (Debian's tcl-dev as an external)
            stubs = sorted(glob.glob(join_path(tcl, "lib*", "libtclstub*.a")))
            stubs += sorted(glob.glob(join_path(tcl.lib, "*", "libtclstub*.a")))
            if stubs:
                args.append(self.define("CAIRN_TCL_STUB_LIBRARY", stubs[0]))
        if spec.satisfies("+python"):
            # The interpreter `cairn import/export` runs for .pt/.bin files, and the package in this
            # Python's site-packages under the prefix (on PYTHONPATH after `spack load cairn`; it
            # finds libcairn relative to itself). Without +python CMake still installs the package,
            # in lib/python3/dist-packages, and records /usr/bin/python3 when there is one.
            args.append(self.define("CAIRN_PYTHON", spec["python"].command.path))
            args.append(self.define("CAIRN_INSTALL_PYTHONDIR", python_purelib))
        return args

    def check(self):
        """`spack install --test=root`: the unit tests only (Catch2, under a minute on 2 cores).
        The integration, Python and system suites start real daemons and batch systems; they run
        in the project's own test suite (scripts/test), not in a package build."""
        ctest = Executable(self.spec["cmake"].prefix.bin.ctest)
        with working_dir(self.builder.build_directory):
            ctest("--output-on-failure", "--timeout", "600", "-R", "^unit_", "-j", str(make_jobs))

    @property
    def libs(self):
        return find_libraries("libcairn", self.prefix, shared=True, recursive=True)

    @property
    def headers(self):
        return find_headers("cairn", self.prefix.include.cairn, recursive=False)

    # ---- stand-alone tests: `spack test run cairn` -------------------------------------------

    def test_version(self):
        """the installed `cairn --version` and `cairnd --version` print the version"""
        for name in ("cairn", "cairnd"):
            with test_part(self, f"test_version_{name}", purpose=f"run {name} --version"):
                exe = which(join_path(self.prefix.bin, name), required=True)
                out = exe("--version", output=str, error=str).strip()
                assert out.startswith(f"{name} "), f"`{name} --version` printed {out!r}"

    def test_c_client(self):
        """compile a C client against the installed cairn.h and libcairn and run it (no daemon)"""
        src = join_path(self.test_suite.current_test_data_dir, "cairn_smoke.c")
        if SPACK_V1 and "c" in self.spec:
            cc = Executable(self.spec["c"].package.cc)
        else:
            cc = Executable(self.compiler.cc)
        libdir = os.path.dirname(self.libs[0])
        cc(
            "-std=c99",
            "-Wall",
            "-Werror",
            f"-I{self.prefix.include}",
            src,
            "-o",
            "cairn_smoke",
            f"-L{libdir}",
            f"-Wl,-rpath,{libdir}",
            "-lcairn",
        )
        out = Executable("./cairn_smoke")(output=str, error=str)
        assert "no daemon: daemon unavailable" in out, out

    def test_python(self):
        """import the installed Python package (+python)"""
        if not self.spec.satisfies("+python"):
            raise SkipTest("built without +python")
        python = self.spec["python"].command
        out = python("-c", "import cairn; print(cairn.__name__)", output=str, error=str)
        assert "cairn" in out, out
