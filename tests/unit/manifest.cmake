# manifest/ (the record of what the destination holds): promotion,
# the stale-entry rule, the file and its refusals; and the parser's fuzz
# target (tests/fuzz/manifest-fuzz.cmake).
add_executable(test-manifest ${CMAKE_CURRENT_LIST_DIR}/test-manifest.c)
target_link_libraries(test-manifest PRIVATE manifest)
add_test(NAME manifest COMMAND test-manifest)
include(${CMAKE_CURRENT_LIST_DIR}/../fuzz/manifest-fuzz.cmake)
