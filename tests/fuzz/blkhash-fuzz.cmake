# libFuzzer target for the --blkhash option value and the blkhash library
# (common/blkhash.c).  Included from tests/unit/blkhash.cmake with
# -DFUZZ=ON and clang; same flags and ctest shape as cli-uri-fuzz.cmake.
if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
  message(WARNING "FUZZ=ON needs clang (CC=clang); blkhash fuzz target skipped")
  return()
endif()
set(BLKHASH_FUZZ_DIR ${CMAKE_CURRENT_LIST_DIR})
set(BLKHASH_FUZZ_TIME 30 CACHE STRING "seconds for the blkhash fuzz target in ctest")
add_executable(fuzz-blkhash ${BLKHASH_FUZZ_DIR}/fuzz-blkhash.c
               ${CMAKE_SOURCE_DIR}/common/blkhash.c)
target_compile_options(fuzz-blkhash PRIVATE
  -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
  -fno-omit-frame-pointer)
target_link_options(fuzz-blkhash PRIVATE -fsanitize=fuzzer,address,undefined)
target_link_libraries(fuzz-blkhash PRIVATE OpenSSL::Crypto Threads::Threads)
set(work ${CMAKE_CURRENT_BINARY_DIR}/fuzz-blkhash-corpus)
file(MAKE_DIRECTORY ${work})
add_test(NAME fuzz-blkhash
         COMMAND fuzz-blkhash -max_total_time=${BLKHASH_FUZZ_TIME} -timeout=10
                 -rss_limit_mb=2048 -print_final_stats=1
                 ${work} ${BLKHASH_FUZZ_DIR}/corpus/fuzz-blkhash)
set_tests_properties(fuzz-blkhash PROPERTIES TIMEOUT 600)
