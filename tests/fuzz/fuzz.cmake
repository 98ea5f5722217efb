# nbdferry_fuzz(TARGET [LIBRARY lib] [SOURCES src...] [LIBS dep...]
#               [RSS_MB n] [QUARANTINE_MB n] [FLAGS f...])
#
# One fuzz target, tests/fuzz/TARGET.c, built two ways from this one
# description, so that the two cannot drift apart:
#
# - Always (every build, every compiler): replay-TARGET, the target's
#   entry point under tests/fuzz/replay.c, and a ctest replay-TARGET that
#   runs it over the committed corpus (corpus/TARGET) and the crash inputs
#   kept for it (crashes/NAME-*, NAME being TARGET without "fuzz-").  A
#   target that no longer links, or a kept input that trips it, fails the
#   ordinary suite and the ASan stage, not only the fuzz stage.
# - With -DFUZZ=ON and clang: TARGET itself, libFuzzer with ASan+UBSan,
#   and a ctest TARGET that runs it FUZZ_TIME seconds.  LIBRARY's
#   sources (the cache's <LIB>_SOURCES, each with the compile options its
#   own directory gives it) are rebuilt with coverage instrumentation as
#   LIBRARY-fuzz, linked with LIBRARY's own dependencies.
#
# SOURCES are compiled into both; LIBS are linked into both.  RSS_MB
# (default 256) holds the code to its bounded-memory promise; a small ASan
# quarantine (QUARANTINE_MB, default 32) keeps freed blocks from filling
# it.  FLAGS: more compile options for everything built here.  Each
# target's name and limits go to ${CMAKE_BINARY_DIR}/fuzz-targets.txt,
# the list scripts/test-sanitizers' fuzz stage runs.
include_guard(GLOBAL)
set(NBDFERRY_FUZZ_DIR ${CMAKE_CURRENT_LIST_DIR})
set(FUZZ_TIME 30 CACHE STRING "seconds per fuzz target in ctest (-DFUZZ=ON)")
file(WRITE ${CMAKE_BINARY_DIR}/fuzz-targets.txt
     "# fuzz target, RSS limit (MB), ASan quarantine (MB)\n")

function(nbdferry_fuzz t)
  cmake_parse_arguments(F "" "LIBRARY;RSS_MB;QUARANTINE_MB"
                        "SOURCES;LIBS;FLAGS" ${ARGN})
  if(NOT F_RSS_MB)
    set(F_RSS_MB 256)
  endif()
  if(NOT F_QUARANTINE_MB)
    set(F_QUARANTINE_MB 32)
  endif()
  string(REGEX REPLACE "^fuzz-" "" short ${t})
  file(GLOB crashes CONFIGURE_DEPENDS ${NBDFERRY_FUZZ_DIR}/crashes/${short}-*)
  file(APPEND ${CMAKE_BINARY_DIR}/fuzz-targets.txt
       "${t} ${F_RSS_MB} ${F_QUARANTINE_MB}\n")

  add_executable(replay-${t} ${NBDFERRY_FUZZ_DIR}/${t}.c
                 ${NBDFERRY_FUZZ_DIR}/replay.c ${F_SOURCES})
  target_include_directories(replay-${t} PRIVATE ${CMAKE_SOURCE_DIR})
  target_compile_options(replay-${t} PRIVATE ${F_FLAGS})
  target_link_libraries(replay-${t} PRIVATE ${F_LIBRARY} ${F_LIBS})
  add_test(NAME replay-${t}
           COMMAND replay-${t} ${NBDFERRY_FUZZ_DIR}/corpus/${t} ${crashes})
  set_tests_properties(replay-${t} PROPERTIES TIMEOUT 600)

  if(NOT FUZZ)
    return()
  endif()
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(WARNING "FUZZ=ON needs clang (CC=clang); ${t} not built")
    return()
  endif()
  set(flags -fsanitize=fuzzer-no-link,address,undefined
            -fno-sanitize-recover=undefined -fno-omit-frame-pointer ${F_FLAGS})
  set(link)
  if(F_LIBRARY)
    set(lf ${F_LIBRARY}-fuzz)
    if(NOT TARGET ${lf})
      string(TOUPPER ${F_LIBRARY} upper)
      get_target_property(libdir ${F_LIBRARY} SOURCE_DIR)
      foreach(src ${${upper}_SOURCES})
        # Source properties belong to a directory: carry the library's
        # own (digest/sha256x.c: -mno-avx) over to this copy.
        get_source_file_property(opts ${src} DIRECTORY ${libdir}
                                 COMPILE_OPTIONS)
        if(opts)
          set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "${opts}")
        endif()
      endforeach()
      add_library(${lf} STATIC ${${upper}_SOURCES})
      target_include_directories(${lf} PUBLIC ${CMAKE_SOURCE_DIR})
      target_compile_options(${lf} PRIVATE ${flags})
      get_target_property(deps ${F_LIBRARY} LINK_LIBRARIES)
      if(deps)
        target_link_libraries(${lf} PUBLIC ${deps})
      endif()
    endif()
    set(link ${lf})
  endif()
  add_executable(${t} ${NBDFERRY_FUZZ_DIR}/${t}.c ${F_SOURCES})
  target_include_directories(${t} PRIVATE ${CMAKE_SOURCE_DIR})
  target_compile_options(${t} PRIVATE ${flags})
  target_link_libraries(${t} PRIVATE ${link} ${F_LIBS})
  target_link_options(${t} PRIVATE -fsanitize=fuzzer,address,undefined)
  set(work ${CMAKE_CURRENT_BINARY_DIR}/${t}-corpus)
  file(MAKE_DIRECTORY ${work})
  add_test(NAME ${t}
           COMMAND ${t} -max_total_time=${FUZZ_TIME} -timeout=10
                   -rss_limit_mb=${F_RSS_MB} -print_final_stats=1
                   ${work} ${NBDFERRY_FUZZ_DIR}/corpus/${t})
  set_tests_properties(${t} PROPERTIES TIMEOUT 600 ENVIRONMENT
                       "ASAN_OPTIONS=quarantine_size_mb=${F_QUARANTINE_MB}")
endfunction()
