# digest/workers.c (the process's one pool of hasher threads) and the
# fork-join over it (digest/hashers.c).
add_executable(test-workers ${CMAKE_CURRENT_LIST_DIR}/test-workers.c
               ${PROJECT_SOURCE_DIR}/digest/hashers.c
               ${PROJECT_SOURCE_DIR}/digest/workers.c)
target_link_libraries(test-workers PRIVATE blkhash)
add_test(NAME workers COMMAND test-workers)
