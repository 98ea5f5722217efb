# nbdferry-vhdx: VHDX inspector (info, check, map, cat, export) over vhdx/.
# Included from tools/CMakeLists.txt.
add_executable(nbdferry-vhdx ${CMAKE_CURRENT_LIST_DIR}/nbdferry-vhdx.c
               ${CMAKE_CURRENT_LIST_DIR}/../imgtool/imgtool.c)
target_link_libraries(nbdferry-vhdx PRIVATE vhdx)
install(TARGETS nbdferry-vhdx DESTINATION ${CMAKE_INSTALL_BINDIR})
