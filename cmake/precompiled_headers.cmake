# Precompiled headers. Most of a cairn compile is spent parsing the same third-party and standard
# headers (nlohmann/json, spdlog and fmt, Catch2's single header in the unit tests) in every
# translation unit; precompiled once per target, they are parsed once. This changes nothing in the
# code: every file still includes what it uses (the headers below are only pre-parsed). But
# they are off by default: -DCAIRN_PCH=ON turns them on (a heavy file of the daemon compiles in 28 s
# instead of 38 s at -O2). With GCC 12 they make that compiler's string-concatenation false positives
# (-Warray-bounds, -Wstringop-overflow) appear, on lines that depend even on the length of a path
# compiled in, so CMakeLists.txt turns those warnings off when both are in use; scripts/build does
# not use them.
option(CAIRN_PCH "Precompile the common third-party and standard headers" OFF)

set(_cairn_pch_headers
    <algorithm> <atomic> <chrono> <condition_variable> <cstdint> <cstring> <functional> <map> <memory>
    <mutex> <optional> <set> <string> <string_view> <thread> <unordered_map> <utility> <vector>
    <nlohmann/json.hpp> <spdlog/spdlog.h>)

# cairn_precompile_headers(TARGET... [CATCH]): the headers above (and with CATCH, catch2/catch.hpp)
# precompiled for the C++ sources of each target.
function(cairn_precompile_headers)
  if(NOT CAIRN_PCH)
    return()
  endif()
  set(headers ${_cairn_pch_headers})
  set(targets ${ARGN})
  if("CATCH" IN_LIST targets)
    list(REMOVE_ITEM targets CATCH)
    list(APPEND headers <catch2/catch.hpp>)
  endif()
  set(genex "")
  foreach(h IN LISTS headers)
    list(APPEND genex "$<$<COMPILE_LANGUAGE:CXX>:${h}>")
  endforeach()
  foreach(t IN LISTS targets)
    if(TARGET ${t})
      target_precompile_headers(${t} PRIVATE ${genex})
    endif()
  endforeach()
endfunction()
