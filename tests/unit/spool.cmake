# views/spool.c (the format views' bounded spool) against a model.
add_executable(test-spool ${CMAKE_CURRENT_LIST_DIR}/test-spool.c
               ${PROJECT_SOURCE_DIR}/views/spool.c)
target_link_libraries(test-spool PRIVATE common)
add_test(NAME spool COMMAND test-spool)
