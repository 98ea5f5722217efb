# nbdferry_format_fuzz(LIB WHAT TARGETS t... [RSS_MB n] [QUARANTINE_MB n]
#                      [FLAGS f...]): libFuzzer targets for the format
# library LIB (only with -DFUZZ=ON and clang; WHAT names it in messages).
# The library's sources (nbdferry_format_library's LIB_SOURCES) are
# rebuilt with coverage instrumentation as LIB-fuzz, with LIB's
# dependencies; each target tests/fuzz/t.c gets ASan+UBSan and a ctest
# LIB-t that runs it <LIB>_FUZZ_TIME seconds.  New inputs go to the first
# (build-tree) directory; the committed seeds (corpus/t) are read only.
# RSS_MB (default 256) holds a decoder to its bounded-memory promise; a
# small ASan quarantine (QUARANTINE_MB, default 32) keeps freed blocks
# from filling it.  FLAGS: more compile options for library and targets.
include_guard(GLOBAL)
set(NBDFERRY_FUZZ_DIR ${CMAKE_CURRENT_LIST_DIR})

function(nbdferry_format_fuzz lib what)
  cmake_parse_arguments(F "" "RSS_MB;QUARANTINE_MB" "TARGETS;FLAGS" ${ARGN})
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(WARNING "FUZZ=ON needs clang (CC=clang); ${what} fuzz targets skipped")
    return()
  endif()
  if(NOT F_RSS_MB)
    set(F_RSS_MB 256)
  endif()
  if(NOT F_QUARANTINE_MB)
    set(F_QUARANTINE_MB 32)
  endif()
  string(TOUPPER ${lib} upper)
  set(flags -fsanitize=fuzzer-no-link,address,undefined
            -fno-sanitize-recover=undefined -fno-omit-frame-pointer ${F_FLAGS})
  add_library(${lib}-fuzz STATIC ${${upper}_SOURCES})
  target_include_directories(${lib}-fuzz PUBLIC ${CMAKE_SOURCE_DIR})
  target_compile_options(${lib}-fuzz PRIVATE ${flags})
  get_target_property(deps ${lib} LINK_LIBRARIES)
  if(deps)
    target_link_libraries(${lib}-fuzz PUBLIC ${deps})
  endif()

  set(${upper}_FUZZ_TIME 30 CACHE STRING
      "seconds per ${what} fuzz target in ctest")
  foreach(t ${F_TARGETS})
    add_executable(${t} ${NBDFERRY_FUZZ_DIR}/${t}.c)
    target_compile_options(${t} PRIVATE ${flags})
    target_link_libraries(${t} PRIVATE ${lib}-fuzz)
    target_link_options(${t} PRIVATE -fsanitize=fuzzer,address,undefined)
    set(work ${CMAKE_CURRENT_BINARY_DIR}/${t}-corpus)
    file(MAKE_DIRECTORY ${work})
    add_test(NAME ${lib}-${t}
             COMMAND ${t} -max_total_time=${${upper}_FUZZ_TIME} -timeout=10
                     -rss_limit_mb=${F_RSS_MB} -print_final_stats=1
                     ${work} ${NBDFERRY_FUZZ_DIR}/corpus/${t})
    set_tests_properties(${lib}-${t} PROPERTIES TIMEOUT 600 ENVIRONMENT
                         "ASAN_OPTIONS=quarantine_size_mb=${F_QUARANTINE_MB}")
  endforeach()
endfunction()
