# vhdfile: a VHD file and its differencing chain, read with pread, over the
# vhd/ library.  Compiled once, linked into nbdferry-vhd and nbdferry-verify.
# Included from tools/CMakeLists.txt; paths are relative to this file.
add_library(vhdfile STATIC ${CMAKE_CURRENT_LIST_DIR}/vhdfile.c)
target_link_libraries(vhdfile PUBLIC vhd)
