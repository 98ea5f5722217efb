# libFuzzer targets for vhd/ (only with -DFUZZ=ON and clang).
# Included from tests/unit/vhd.cmake.  The library is rebuilt with
# coverage instrumentation; targets get ASan+UBSan.
if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
  message(WARNING "FUZZ=ON needs clang (CC=clang); VHD fuzz targets skipped")
  return()
endif()
set(VHD_FUZZ_DIR ${CMAKE_CURRENT_LIST_DIR})
set(VHD_FUZZ_FLAGS -fsanitize=fuzzer-no-link,address,undefined
                   -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
add_library(vhd-fuzz STATIC ${VHD_SOURCES})
target_compile_options(vhd-fuzz PRIVATE ${VHD_FUZZ_FLAGS})

set(VHD_FUZZ_TIME 30 CACHE STRING "seconds per VHD fuzz target in ctest")
# fuzz-vhd-synth: the export view's synthesizer; fuzz-vhd-locator: parent
# locator paths and the VHD tool's resolution of them (vhdfile/vhdfile.c).
foreach(t fuzz-vhd-parse fuzz-vhd-stream fuzz-vhd-synth fuzz-vhd-locator)
  add_executable(${t} ${VHD_FUZZ_DIR}/${t}.c)
  target_compile_options(${t} PRIVATE ${VHD_FUZZ_FLAGS})
  target_link_libraries(${t} PRIVATE vhd-fuzz)
  target_link_options(${t} PRIVATE -fsanitize=fuzzer,address,undefined)
  # New inputs go to the first (build-tree) directory; the committed seeds
  # are read only.
  set(work ${CMAKE_CURRENT_BINARY_DIR}/${t}-corpus)
  file(MAKE_DIRECTORY ${work})
  add_test(NAME vhd-${t}
           COMMAND ${t} -max_total_time=${VHD_FUZZ_TIME} -timeout=10
                   -rss_limit_mb=256 -print_final_stats=1
                   ${work} ${VHD_FUZZ_DIR}/corpus/${t})
  set_tests_properties(vhd-${t} PROPERTIES TIMEOUT 600
                        ENVIRONMENT "ASAN_OPTIONS=quarantine_size_mb=16")
endforeach()
