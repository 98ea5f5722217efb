# Fuzz target for vhdx/ (see fuzz.cmake).  Included from
# tests/unit/vhdx.cmake.
include(${CMAKE_CURRENT_LIST_DIR}/fuzz.cmake)
nbdferry_fuzz(fuzz-vhdx-stream LIBRARY vhdx RSS_MB 512)
