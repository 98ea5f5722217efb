# libFuzzer targets for qcow2/ (only with -DFUZZ=ON and clang).  Included
# from tests/unit/qcow2.cmake; same shape as vmdk-fuzz.cmake.  The library
# is rebuilt with coverage instrumentation; targets get ASan+UBSan.
if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
  message(WARNING "FUZZ=ON needs clang (CC=clang); qcow2 fuzz targets skipped")
  return()
endif()
set(QCOW2_FUZZ_DIR ${CMAKE_CURRENT_LIST_DIR})
set(QCOW2_FUZZ_FLAGS -fsanitize=fuzzer-no-link,address,undefined
                     -fno-sanitize-recover=undefined -fno-omit-frame-pointer
                     -UNDEBUG)         # the decoder's asserts are oracles too
add_library(qcow2-fuzz STATIC ${QCOW2_SOURCES})
target_include_directories(qcow2-fuzz PUBLIC ${CMAKE_SOURCE_DIR})
target_compile_options(qcow2-fuzz PRIVATE ${QCOW2_FUZZ_FLAGS})
target_link_libraries(qcow2-fuzz PUBLIC PkgConfig::QCOW2_DEPS)

set(QCOW2_FUZZ_TIME 30 CACHE STRING "seconds per qcow2 fuzz target in ctest")
foreach(t fuzz-qcow2-parse fuzz-qcow2-stream)
  add_executable(${t} ${QCOW2_FUZZ_DIR}/${t}.c)
  target_compile_options(${t} PRIVATE ${QCOW2_FUZZ_FLAGS})
  target_link_libraries(${t} PRIVATE qcow2-fuzz)
  target_link_options(${t} PRIVATE -fsanitize=fuzzer,address,undefined)
  set(work ${CMAKE_CURRENT_BINARY_DIR}/${t}-corpus)
  file(MAKE_DIRECTORY ${work})
  add_test(NAME qcow2-${t}
           COMMAND ${t} -max_total_time=${QCOW2_FUZZ_TIME} -timeout=10
                   -rss_limit_mb=256 -print_final_stats=1
                   ${work} ${QCOW2_FUZZ_DIR}/corpus/${t})
  set_tests_properties(qcow2-${t} PROPERTIES TIMEOUT 600
                       ENVIRONMENT "ASAN_OPTIONS=quarantine_size_mb=32")
endforeach()
