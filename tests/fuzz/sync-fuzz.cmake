# Fuzz target for nbdferry-sync's change-list parsers
# (tools/sync/changed.c; see fuzz.cmake).  Included from
# tests/unit/sync.cmake.
include(${CMAKE_CURRENT_LIST_DIR}/fuzz.cmake)
nbdferry_fuzz(fuzz-sync-list SOURCES ${CMAKE_SOURCE_DIR}/tools/sync/changed.c)
