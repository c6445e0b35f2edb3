# Included by the top-level CMakeLists.txt: defines CAIRN_WITH_FORTRAN, ON by default when a Fortran
# compiler is found (check_language only looks; api/fortran/CMakeLists.txt enables the language).
# Off by default in fuzzing builds (their -fsanitize=fuzzer flags are clang's, not gfortran's) and in
# sanitized builds (the Fortran test, like the other system suites, runs once, in the plain build).
include(CheckLanguage)
check_language(Fortran)
if(CMAKE_Fortran_COMPILER AND NOT CAIRN_FUZZ AND NOT CAIRN_SANITIZE)
  set(_fortran_default ON)
else()
  set(_fortran_default OFF)
endif()
option(CAIRN_WITH_FORTRAN "Build the Fortran module cairn (api/fortran, docs/fortran.md)" ${_fortran_default})
