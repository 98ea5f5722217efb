# The small helper headers in common/ (iszero.h, minmax.h, rounding.h,
# monotime.h, list.h, uuid.h, cleanup.h, imagekind.h, err.h, fileorder.h,
# unitlist.h, bigbuf.h, vector.h): one test program each.
foreach(t iszero minmax rounding monotime list uuid cleanup imagekind err
          fileorder unitlist bigbuf vector)
  add_executable(common-test-${t} ${CMAKE_CURRENT_LIST_DIR}/common-test-${t}.c)
  target_link_libraries(common-test-${t} PRIVATE Threads::Threads)
  add_test(NAME common-${t} COMMAND common-test-${t})
endforeach()

# common/format.h: the format contract, run over every library's row.
add_executable(common-test-format ${CMAKE_CURRENT_LIST_DIR}/common-test-format.c)
target_link_libraries(common-test-format PRIVATE vhd vmdk qcow2 vhdx)
add_test(NAME common-format COMMAND common-test-format)

# fs/trace.h over common/log.c: the -v request trace.
add_executable(trace-test ${CMAKE_CURRENT_LIST_DIR}/trace-test.c)
target_link_libraries(trace-test PRIVATE common PkgConfig::DEPS
                      Threads::Threads)
add_test(NAME trace COMMAND trace-test)
