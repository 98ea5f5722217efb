# tools/sync/changed.c: nbdferry-sync's change-list parsers.
add_executable(sync-changed-test ${CMAKE_CURRENT_LIST_DIR}/sync-changed-test.c
  ${CMAKE_SOURCE_DIR}/tools/sync/changed.c)
add_test(NAME sync-changed COMMAND sync-changed-test)
include(${CMAKE_CURRENT_LIST_DIR}/../fuzz/sync-fuzz.cmake)
