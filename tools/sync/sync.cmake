# nbdferry-sync: copy the blocks a change list names into a mount.
# Included from tools/CMakeLists.txt; paths are relative to this file.
add_executable(nbdferry-sync
  ${CMAKE_CURRENT_LIST_DIR}/nbdferry-sync.c
  ${CMAKE_CURRENT_LIST_DIR}/changed.c
  ${CMAKE_CURRENT_LIST_DIR}/source.c
  ${CMAKE_CURRENT_LIST_DIR}/status.c
  ${CMAKE_CURRENT_LIST_DIR}/err.c)
target_link_libraries(nbdferry-sync PRIVATE PkgConfig::DEPS)
install(TARGETS nbdferry-sync DESTINATION ${CMAKE_INSTALL_BINDIR})
