# digest/workers.c (the process's one pool of hasher threads) and the
# fork-join over it (digest/hashers.c).
add_executable(workers-test ${CMAKE_CURRENT_LIST_DIR}/workers-test.c
               ${PROJECT_SOURCE_DIR}/digest/hashers.c
               ${PROJECT_SOURCE_DIR}/digest/workers.c)
target_link_libraries(workers-test PRIVATE blkhash)
add_test(NAME workers COMMAND workers-test)
