# -o handling in daemon/cliargs.c (fuse_opt_parse with nbdferry's option table).
add_executable(cli-opts-test ${CMAKE_CURRENT_LIST_DIR}/cli-opts-test.c
               ${CMAKE_SOURCE_DIR}/daemon/cliargs.c)
target_link_libraries(cli-opts-test PRIVATE PkgConfig::DEPS)
add_test(NAME cli-opts COMMAND cli-opts-test)
