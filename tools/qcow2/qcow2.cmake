# nbdferry-qcow2: qcow2 inspector (info, check, map, cat, export) over qcow2/.
# Included from tools/CMakeLists.txt.
add_executable(nbdferry-qcow2 ${CMAKE_CURRENT_LIST_DIR}/nbdferry-qcow2.c
               ${CMAKE_CURRENT_LIST_DIR}/../imgtool/imgtool.c)
target_link_libraries(nbdferry-qcow2 PRIVATE qcow2)
install(TARGETS nbdferry-qcow2 DESTINATION ${CMAKE_INSTALL_BINDIR})
