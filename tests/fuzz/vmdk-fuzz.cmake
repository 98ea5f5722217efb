# libFuzzer targets for vmdk/ (only with -DFUZZ=ON and clang).  Included
# from tests/unit/vmdk.cmake; same shape as vhd-fuzz.cmake.  The library
# is rebuilt with coverage instrumentation; targets get ASan+UBSan.
if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
  message(WARNING "FUZZ=ON needs clang (CC=clang); VMDK fuzz targets skipped")
  return()
endif()
set(VMDK_FUZZ_DIR ${CMAKE_CURRENT_LIST_DIR})
set(VMDK_FUZZ_FLAGS -fsanitize=fuzzer-no-link,address,undefined
                    -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
add_library(vmdk-fuzz STATIC ${VMDK_SOURCES})
target_include_directories(vmdk-fuzz PUBLIC ${CMAKE_SOURCE_DIR})
target_compile_options(vmdk-fuzz PRIVATE ${VMDK_FUZZ_FLAGS})
target_link_libraries(vmdk-fuzz PUBLIC PkgConfig::DEFLATE)

set(VMDK_FUZZ_TIME 30 CACHE STRING "seconds per VMDK fuzz target in ctest")
foreach(t fuzz-vmdk-parse fuzz-vmdk-stream)
  add_executable(${t} ${VMDK_FUZZ_DIR}/${t}.c)
  target_compile_options(${t} PRIVATE ${VMDK_FUZZ_FLAGS})
  target_link_libraries(${t} PRIVATE vmdk-fuzz)
  target_link_options(${t} PRIVATE -fsanitize=fuzzer,address,undefined)
  set(work ${CMAKE_CURRENT_BINARY_DIR}/${t}-corpus)
  file(MAKE_DIRECTORY ${work})
  add_test(NAME vmdk-${t}
           COMMAND ${t} -max_total_time=${VMDK_FUZZ_TIME} -timeout=10
                   -rss_limit_mb=256 -print_final_stats=1
                   ${work} ${VMDK_FUZZ_DIR}/corpus/${t})
  # 256 MB holds the decoder to its bounded-memory promise; ASan's
  # quarantine of freed blocks would otherwise fill it.
  set_tests_properties(vmdk-${t} PROPERTIES TIMEOUT 600
                       ENVIRONMENT "ASAN_OPTIONS=quarantine_size_mb=32")
endforeach()
