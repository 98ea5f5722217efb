# views/spool.c (the format views' bounded spool) against a model.
add_executable(spool-test ${CMAKE_CURRENT_LIST_DIR}/spool-test.c
               ${PROJECT_SOURCE_DIR}/views/spool.c)
target_link_libraries(spool-test PRIVATE common)
add_test(NAME spool COMMAND spool-test)
