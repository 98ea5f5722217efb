# libFuzzer targets for the command-line helpers (fs/cli.c) and URI
# redaction (transport/uri.c).  Included from tests/unit/cli-uri.cmake
# with -DFUZZ=ON and clang; same flags and ctest shape as vhd-fuzz.cmake.
if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
  message(WARNING "FUZZ=ON needs clang (CC=clang); cli/uri fuzz targets skipped")
  return()
endif()
set(CLI_FUZZ_DIR ${CMAKE_CURRENT_LIST_DIR})
set(CLI_FUZZ_FLAGS -fsanitize=fuzzer-no-link,address,undefined
                   -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
set(CLI_FUZZ_TIME 30 CACHE STRING "seconds per cli/uri fuzz target in ctest")
set(fuzz-cli_SOURCES ${CMAKE_SOURCE_DIR}/fs/cliargs.c
                      ${CMAKE_SOURCE_DIR}/fs/mountpoint.c)
set(fuzz-uri_SOURCES ${CMAKE_SOURCE_DIR}/transport/uri.c)
foreach(t fuzz-cli fuzz-uri)
  add_executable(${t} ${CLI_FUZZ_DIR}/${t}.c ${${t}_SOURCES})
  target_compile_options(${t} PRIVATE ${CLI_FUZZ_FLAGS})
  target_link_options(${t} PRIVATE -fsanitize=fuzzer,address,undefined)
  if(t STREQUAL "fuzz-cli")
    target_link_libraries(${t} PRIVATE PkgConfig::DEPS)  # fuse_opt_parse
  endif()
  set(work ${CMAKE_CURRENT_BINARY_DIR}/${t}-corpus)
  file(MAKE_DIRECTORY ${work})
  add_test(NAME ${t}
           COMMAND ${t} -max_total_time=${CLI_FUZZ_TIME} -timeout=10
                   -rss_limit_mb=256 -print_final_stats=1
                   ${work} ${CLI_FUZZ_DIR}/corpus/${t})
  # 256 MiB bounds the helpers' memory; ASan's quarantine of freed
  # blocks (256 MiB by default) would fill it on its own.
  set_tests_properties(${t} PROPERTIES TIMEOUT 600
                       ENVIRONMENT ASAN_OPTIONS=quarantine_size_mb=16)
endforeach()
