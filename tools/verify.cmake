# nbdferry-verify: digest a source disk and its copy on an NBD export.
# Included from tools/CMakeLists.txt; paths are relative to this file.
add_executable(nbdferry-verify
  ${CMAKE_CURRENT_LIST_DIR}/nbdferry-verify.c
  ${CMAKE_CURRENT_LIST_DIR}/verify/fingerprint.c
  ${CMAKE_CURRENT_LIST_DIR}/verify/log.c
  ${CMAKE_CURRENT_LIST_DIR}/verify/report.c
  ${CMAKE_CURRENT_LIST_DIR}/verify/sink.c
  ${CMAKE_CURRENT_LIST_DIR}/verify/hasher.c
  ${CMAKE_CURRENT_LIST_DIR}/verify/source.c
  ${CMAKE_CURRENT_LIST_DIR}/verify/source-stream.c
  ${CMAKE_CURRENT_LIST_DIR}/verify/source-file.c
  ${CMAKE_CURRENT_LIST_DIR}/verify/source-nbd.c
  ${CMAKE_CURRENT_LIST_DIR}/verify/source-vhd.c
  ${CMAKE_CURRENT_LIST_DIR}/vhdfile.c)
target_link_libraries(nbdferry-verify PRIVATE
  vhd blkhash PkgConfig::DEPS OpenSSL::Crypto Threads::Threads)
install(TARGETS nbdferry-verify DESTINATION ${CMAKE_INSTALL_BINDIR})
