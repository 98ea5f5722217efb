# nbdferry-vhd: VHD inspector (info, check, map, cat, export) over vhd/.
# Included from tools/CMakeLists.txt; paths are relative to this file.
# The image file reader (imagefile/) is shared with nbdferry-verify.
add_executable(nbdferry-vhd ${CMAKE_CURRENT_LIST_DIR}/nbdferry-vhd.c
               ${CMAKE_CURRENT_LIST_DIR}/../imgtool/imgtool.c)
target_link_libraries(nbdferry-vhd PRIVATE imagefile vhd)
install(TARGETS nbdferry-vhd DESTINATION ${CMAKE_INSTALL_BINDIR})
