# nbdferry-vmdk: VMDK inspector (info, check, map, cat, export) over vmdk/.
# Included from tools/CMakeLists.txt.
add_executable(nbdferry-vmdk ${CMAKE_CURRENT_LIST_DIR}/nbdferry-vmdk.c
               ${CMAKE_CURRENT_LIST_DIR}/../imgtool/imgtool.c)
target_link_libraries(nbdferry-vmdk PRIVATE vmdk)
install(TARGETS nbdferry-vmdk DESTINATION ${CMAKE_INSTALL_BINDIR})
