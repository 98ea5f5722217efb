# blkhash library unit test (common/blkhash.c), public check values included.
add_executable(blkhash-test ${CMAKE_CURRENT_LIST_DIR}/blkhash-test.c)
target_link_libraries(blkhash-test PRIVATE blkhash)
add_test(NAME blkhash COMMAND blkhash-test)

# Its fuzz targets: replayed here, libFuzzer with -DFUZZ=ON.
include(${CMAKE_CURRENT_LIST_DIR}/../fuzz/blkhash-fuzz.cmake)

# SHA-256 side by side (common/sha256x.c) against OpenSSL; blkhash-test
# again on OpenSSL's path alone and on the SHA-NI lanes alone (without
# the variable: what the CPU here chooses, AVX-512 where it has it).
add_executable(sha256x-test ${CMAKE_CURRENT_LIST_DIR}/sha256x-test.c)
target_link_libraries(sha256x-test PRIVATE blkhash)
add_test(NAME sha256x COMMAND sha256x-test)
add_test(NAME sha256x-sha-ni COMMAND sha256x-test)
set_tests_properties(sha256x-sha-ni PROPERTIES
                     ENVIRONMENT NBDFERRY_SHA256=sha-ni)
add_test(NAME blkhash-openssl COMMAND blkhash-test)
set_tests_properties(blkhash-openssl PROPERTIES
                     ENVIRONMENT NBDFERRY_SHA256=openssl)
add_test(NAME blkhash-sha-ni COMMAND blkhash-test)
set_tests_properties(blkhash-sha-ni PROPERTIES
                     ENVIRONMENT NBDFERRY_SHA256=sha-ni)
