# digest/blkpass.c (the inline blkhash's view of the raw file) against a model.
add_executable(test-blkpass ${CMAKE_CURRENT_LIST_DIR}/test-blkpass.c
               ${PROJECT_SOURCE_DIR}/digest/blkpass.c
               ${PROJECT_SOURCE_DIR}/digest/hashers.c
               ${PROJECT_SOURCE_DIR}/digest/workers.c)
target_link_libraries(test-blkpass PRIVATE transport blkhash)
add_test(NAME blkpass COMMAND test-blkpass)
