# Pool unit tests over a scripted transport (included from
# tests/CMakeLists.txt): transport/pool.c is built again against
# pool-test-nbdx.c instead of the libnbd-backed nbdx.c.
set(POOL_TEST_DIR ${CMAKE_CURRENT_LIST_DIR})

add_executable(pool-test-fill
  ${POOL_TEST_DIR}/pool-test-fill.c
  ${POOL_TEST_DIR}/pool-test-nbdx.c
  ${CMAKE_SOURCE_DIR}/transport/pool.c
  ${CMAKE_SOURCE_DIR}/transport/extmap.c)
target_include_directories(pool-test-fill PRIVATE ${POOL_TEST_DIR})
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
target_link_libraries(pool-test-aread PRIVATE common PkgConfig::DEPS
                      Threads::Threads)
add_test(NAME pool-aread COMMAND pool-test-aread)
set_tests_properties(pool-aread PROPERTIES TIMEOUT 300)
