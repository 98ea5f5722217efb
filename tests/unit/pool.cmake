# Range maps and the write-back pool (included from tests/CMakeLists.txt).
# Both build their sources here with assertions on (-UNDEBUG), whatever
# the build type: the pool's ordering invariants are asserted.
set(POOL_TEST_DIR ${CMAKE_CURRENT_LIST_DIR})
set(TRANSPORT_DIR ${CMAKE_SOURCE_DIR}/transport)

add_executable(test-extmap ${POOL_TEST_DIR}/test-extmap.c
               ${TRANSPORT_DIR}/extmap.c)
target_compile_options(test-extmap PRIVATE -UNDEBUG)
target_link_options(test-extmap PRIVATE -Wl,--wrap=malloc)
add_test(NAME extmap COMMAND test-extmap)

# transport/pool*.c (POOL_SOURCES, from transport/CMakeLists.txt) over
# the scripted transport tests/unit/fake-nbdx.c instead of nbdx.c (but for nbdx-run.c, its nbdx_run() over the fake's
# nbdx_submit()), with the before-wait hook and allocation failure
# injection (--wrap) the fake provides: test-pool (interleavings, the
# model), test-pool-fill (zero-copy writes, holds), test-pool-aread
# (reads started without waiting), test-pool-land (writes received
# straight into their buffer), test-pool-damage (failures kept as damage
# until repaired, retries, writes lost at a reconnect), test-pool-own (lent
# memory keeps its bytes while the rest of the pool is reused),
# test-pool-resend (acknowledged writes kept until a flush covers them,
# resent after a reconnect; the pool's own flushes).
function(pool_unit_test name exe timeout)
  add_executable(${exe} ${POOL_TEST_DIR}/${exe}.c
                 ${POOL_TEST_DIR}/fake-nbdx.c ${POOL_SOURCES}
                 ${TRANSPORT_DIR}/nbdx-run.c ${TRANSPORT_DIR}/extmap.c)
  target_compile_definitions(${exe} PRIVATE POOL_TEST_HOOKS)
  target_compile_options(${exe} PRIVATE -UNDEBUG)
  target_include_directories(${exe} PRIVATE ${POOL_TEST_DIR})
  target_link_libraries(${exe} PRIVATE common PkgConfig::DEPS
                        Threads::Threads)
  target_link_options(${exe} PRIVATE -Wl,--wrap=malloc -Wl,--wrap=calloc
                      -Wl,--wrap=realloc -Wl,--wrap=posix_memalign)
  add_test(NAME ${name} COMMAND ${exe})
  set_tests_properties(${name} PROPERTIES TIMEOUT ${timeout})
endfunction()

pool_unit_test(pool test-pool 900)
pool_unit_test(pool-fill test-pool-fill 300)
pool_unit_test(pool-aread test-pool-aread 300)
pool_unit_test(pool-land test-pool-land 300)
pool_unit_test(pool-damage test-pool-damage 120)
pool_unit_test(pool-own test-pool-own 300)
pool_unit_test(pool-resend test-pool-resend 120)
