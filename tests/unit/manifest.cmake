# manifest/ (the record of what the destination holds): promotion,
# the stale-entry rule, the file and its refusals; and the parser's fuzz
# target (tests/fuzz/manifest-fuzz.cmake).
add_executable(manifest-test ${CMAKE_CURRENT_LIST_DIR}/manifest-test.c)
target_link_libraries(manifest-test PRIVATE manifest)
add_test(NAME manifest COMMAND manifest-test)
include(${CMAKE_CURRENT_LIST_DIR}/../fuzz/manifest-fuzz.cmake)
