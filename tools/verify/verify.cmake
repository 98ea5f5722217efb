# nbdferry-verify: digest a source disk and its copy on an NBD export.
# Included from tools/CMakeLists.txt; paths are relative to this file.
add_executable(nbdferry-verify
  ${CMAKE_CURRENT_LIST_DIR}/nbdferry-verify.c
  ${CMAKE_CURRENT_LIST_DIR}/report.c
  ${CMAKE_CURRENT_LIST_DIR}/probe.c
  ${CMAKE_CURRENT_LIST_DIR}/source.c
  ${CMAKE_CURRENT_LIST_DIR}/source-stream.c
  ${CMAKE_CURRENT_LIST_DIR}/source-file.c
  ${CMAKE_CURRENT_LIST_DIR}/source-nbd.c
  ${CMAKE_CURRENT_LIST_DIR}/source-image.c)
target_link_libraries(nbdferry-verify PRIVATE
  verify transport imagefile vhd vmdk vhdx qcow2 blkhash PkgConfig::DEPS OpenSSL::Crypto Threads::Threads)
install(TARGETS nbdferry-verify DESTINATION ${CMAKE_INSTALL_BINDIR})
