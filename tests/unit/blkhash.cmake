# blkhash library unit test (digest/blkhash.c), public check values included.
add_executable(test-blkhash ${CMAKE_CURRENT_LIST_DIR}/test-blkhash.c)
target_link_libraries(test-blkhash PRIVATE blkhash)
add_test(NAME blkhash COMMAND test-blkhash)

# Its fuzz targets: replayed here, libFuzzer with -DFUZZ=ON.
include(${CMAKE_CURRENT_LIST_DIR}/../fuzz/blkhash-fuzz.cmake)

# SHA-256 side by side (digest/sha256x.c) against OpenSSL; test-blkhash
# again on OpenSSL's path alone and on the SHA-NI lanes alone (without
# the variable: what the CPU here chooses, AVX-512 where it has it).
add_executable(test-sha256x ${CMAKE_CURRENT_LIST_DIR}/test-sha256x.c)
target_link_libraries(test-sha256x PRIVATE blkhash)
add_test(NAME sha256x COMMAND test-sha256x)
add_test(NAME sha256x-sha-ni COMMAND test-sha256x)
set_tests_properties(sha256x-sha-ni PROPERTIES
                     ENVIRONMENT NBDFERRY_SHA256=sha-ni)
add_test(NAME blkhash-openssl COMMAND test-blkhash)
set_tests_properties(blkhash-openssl PROPERTIES
                     ENVIRONMENT NBDFERRY_SHA256=openssl)
add_test(NAME blkhash-sha-ni COMMAND test-blkhash)
set_tests_properties(blkhash-sha-ni PROPERTIES
                     ENVIRONMENT NBDFERRY_SHA256=sha-ni)
