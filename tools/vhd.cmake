# nbdferry-vhd: VHD inspector (info, check, map, cat, export) over vhd/.
# Included from tools/CMakeLists.txt; paths are relative to this file.
# vhdfile.c (a VHD file and its chain, read with pread) is shared with
# nbdferry-verify (tools/verify.cmake).
add_executable(nbdferry-vhd
  ${CMAKE_CURRENT_LIST_DIR}/nbdferry-vhd.c
  ${CMAKE_CURRENT_LIST_DIR}/vhdfile.c)
target_link_libraries(nbdferry-vhd PRIVATE vhd)
install(TARGETS nbdferry-vhd DESTINATION ${CMAKE_INSTALL_BINDIR})
