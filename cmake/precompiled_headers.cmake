# Precompiled headers. Most of a cairn compile is spent parsing the same third-party and standard
# headers (nlohmann/json, spdlog and fmt, Catch2's single header in the unit tests) in every
# translation unit; precompiled once per target, they are parsed once. This changes nothing in the
# code: every file still includes what it uses (the headers below are only pre-parsed), and
# -DCAIRN_PCH=OFF builds without them.
option(CAIRN_PCH "Precompile the common third-party and standard headers" ON)

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
