# Range maps and the write-back pool (included from tests/CMakeLists.txt).
# Both build their sources here with assertions on (-UNDEBUG), whatever
# the build type: the pool's ordering invariants are asserted.
set(POOL_TEST_DIR ${CMAKE_CURRENT_LIST_DIR})
set(TRANSPORT_DIR ${CMAKE_SOURCE_DIR}/transport)

add_executable(extmap-test ${POOL_TEST_DIR}/extmap-test.c
               ${TRANSPORT_DIR}/extmap.c)
target_compile_options(extmap-test PRIVATE -UNDEBUG)
target_link_options(extmap-test PRIVATE -Wl,--wrap=malloc)
add_test(NAME extmap COMMAND extmap-test)

# transport/pool.c over tests/unit/fake-nbdx.c instead of nbdx.c.
add_executable(pool-test ${POOL_TEST_DIR}/pool-test.c
               ${POOL_TEST_DIR}/fake-nbdx.c ${TRANSPORT_DIR}/pool.c
               ${TRANSPORT_DIR}/extmap.c)
target_compile_definitions(pool-test PRIVATE POOL_TEST_HOOKS)
target_compile_options(pool-test PRIVATE -UNDEBUG)
target_include_directories(pool-test PRIVATE ${POOL_TEST_DIR})
target_link_libraries(pool-test PRIVATE common PkgConfig::DEPS
                      Threads::Threads)
target_link_options(pool-test PRIVATE -Wl,--wrap=malloc -Wl,--wrap=calloc
                    -Wl,--wrap=realloc -Wl,--wrap=posix_memalign)
add_test(NAME pool COMMAND pool-test)
set_tests_properties(pool PROPERTIES TIMEOUT 900)

# The zero-copy fill path over its own scripted transport,
# pool-test-nbdx.c.

add_executable(pool-test-fill
  ${POOL_TEST_DIR}/pool-test-fill.c
  ${POOL_TEST_DIR}/pool-test-nbdx.c
  ${CMAKE_SOURCE_DIR}/transport/pool.c
  ${CMAKE_SOURCE_DIR}/transport/extmap.c)
target_include_directories(pool-test-fill PRIVATE ${POOL_TEST_DIR})
target_compile_options(pool-test-fill PRIVATE -UNDEBUG)
target_link_libraries(pool-test-fill PRIVATE common PkgConfig::DEPS
                      Threads::Threads)
add_test(NAME pool-fill COMMAND pool-test-fill)
set_tests_properties(pool-fill PROPERTIES TIMEOUT 300)

add_executable(pool-test-aread
  ${POOL_TEST_DIR}/pool-test-aread.c
  ${POOL_TEST_DIR}/pool-test-nbdx.c
  ${CMAKE_SOURCE_DIR}/transport/pool.c
  ${CMAKE_SOURCE_DIR}/transport/extmap.c)
target_include_directories(pool-test-aread PRIVATE ${POOL_TEST_DIR})
target_compile_options(pool-test-aread PRIVATE -UNDEBUG)
target_link_libraries(pool-test-aread PRIVATE common PkgConfig::DEPS
                      Threads::Threads)
add_test(NAME pool-aread COMMAND pool-test-aread)
set_tests_properties(pool-aread PROPERTIES TIMEOUT 300)
