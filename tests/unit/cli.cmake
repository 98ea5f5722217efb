# -o handling in daemon/cliargs.c (fuse_opt_parse with nbdferry's option table).
add_executable(test-cli-opts ${CMAKE_CURRENT_LIST_DIR}/test-cli-opts.c
               ${CMAKE_SOURCE_DIR}/daemon/cliargs.c)
target_link_libraries(test-cli-opts PRIVATE PkgConfig::DEPS)
add_test(NAME cli-opts COMMAND test-cli-opts)
