# digest/blkpass.c (the inline blkhash's view of the raw file) against a model.
add_executable(blkpass-test ${CMAKE_CURRENT_LIST_DIR}/blkpass-test.c
               ${PROJECT_SOURCE_DIR}/digest/blkpass.c
               ${PROJECT_SOURCE_DIR}/digest/hashers.c
               ${PROJECT_SOURCE_DIR}/digest/workers.c)
target_link_libraries(blkpass-test PRIVATE transport blkhash)
add_test(NAME blkpass COMMAND blkpass-test)
