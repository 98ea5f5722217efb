# tools/sync/changed.c: nbdferry-sync's change-list parsers.
add_executable(test-sync-changed ${CMAKE_CURRENT_LIST_DIR}/test-sync-changed.c
  ${CMAKE_SOURCE_DIR}/tools/sync/changed.c)
add_test(NAME sync-changed COMMAND test-sync-changed)
include(${CMAKE_CURRENT_LIST_DIR}/../fuzz/sync-fuzz.cmake)
