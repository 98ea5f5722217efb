# Fuzz targets for vmdk/ (see fuzz.cmake).  Included from
# tests/unit/vmdk.cmake.
include(${CMAKE_CURRENT_LIST_DIR}/fuzz.cmake)
foreach(t fuzz-vmdk-parse fuzz-vmdk-stream)
  nbdferry_fuzz(${t} LIBRARY vmdk)
endforeach()
