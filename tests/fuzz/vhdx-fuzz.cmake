# libFuzzer target for vhdx/ (only with -DFUZZ=ON and clang).  Included
# from tests/unit/vhdx.cmake; same shape as vhd-fuzz.cmake.  The library
# is rebuilt with coverage instrumentation; the target gets ASan+UBSan.
if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
  message(WARNING "FUZZ=ON needs clang (CC=clang); VHDX fuzz target skipped")
  return()
endif()
set(VHDX_FUZZ_DIR ${CMAKE_CURRENT_LIST_DIR})
set(VHDX_FUZZ_FLAGS -fsanitize=fuzzer-no-link,address,undefined
                    -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
add_library(vhdx-fuzz STATIC ${VHDX_SOURCES})
target_include_directories(vhdx-fuzz PUBLIC ${CMAKE_SOURCE_DIR})
target_compile_options(vhdx-fuzz PRIVATE ${VHDX_FUZZ_FLAGS})
target_link_libraries(vhdx-fuzz PUBLIC Threads::Threads)

set(VHDX_FUZZ_TIME 30 CACHE STRING "seconds per VHDX fuzz target in ctest")
add_executable(fuzz-vhdx-stream ${VHDX_FUZZ_DIR}/fuzz-vhdx-stream.c)
target_compile_options(fuzz-vhdx-stream PRIVATE ${VHDX_FUZZ_FLAGS})
target_link_libraries(fuzz-vhdx-stream PRIVATE vhdx-fuzz)
target_link_options(fuzz-vhdx-stream PRIVATE -fsanitize=fuzzer,address,undefined)
set(work ${CMAKE_CURRENT_BINARY_DIR}/fuzz-vhdx-stream-corpus)
file(MAKE_DIRECTORY ${work})
add_test(NAME vhdx-fuzz-vhdx-stream
         COMMAND fuzz-vhdx-stream -max_total_time=${VHDX_FUZZ_TIME} -timeout=10
                 -rss_limit_mb=512 -print_final_stats=1
                 ${work} ${VHDX_FUZZ_DIR}/corpus/fuzz-vhdx-stream)
set_tests_properties(vhdx-fuzz-vhdx-stream PROPERTIES TIMEOUT 600
                     ENVIRONMENT "ASAN_OPTIONS=quarantine_size_mb=32")
