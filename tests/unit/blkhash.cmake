# blkhash library unit test (common/blkhash.c), public check values included.
add_executable(blkhash-test ${CMAKE_CURRENT_LIST_DIR}/blkhash-test.c)
target_link_libraries(blkhash-test PRIVATE blkhash)
add_test(NAME blkhash COMMAND blkhash-test)
