# The small helper headers in common/ (iszero.h, minmax.h, rounding.h,
# monotime.h, list.h, uuid.h, cleanup.h, imagekind.h, err.h, fileorder.h,
# unitlist.h, bigbuf.h, vector.h): one test program each.
foreach(t iszero minmax rounding monotime list uuid cleanup imagekind err
          fileorder unitlist bigbuf vector)
  add_executable(test-common-${t} ${CMAKE_CURRENT_LIST_DIR}/test-common-${t}.c)
  target_link_libraries(test-common-${t} PRIVATE Threads::Threads)
  add_test(NAME common-${t} COMMAND test-common-${t})
endforeach()

# common/format.h: the format contract, run over every library's row.
add_executable(test-common-format ${CMAKE_CURRENT_LIST_DIR}/test-common-format.c)
target_link_libraries(test-common-format PRIVATE vhd vmdk qcow2 vhdx)
add_test(NAME common-format COMMAND test-common-format)

# fs/trace.h over common/log.c: the -v request trace.
add_executable(test-trace ${CMAKE_CURRENT_LIST_DIR}/test-trace.c)
target_link_libraries(test-trace PRIVATE common PkgConfig::DEPS
                      Threads::Threads)
add_test(NAME trace COMMAND test-trace)
