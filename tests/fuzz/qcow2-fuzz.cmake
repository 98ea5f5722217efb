# Fuzz targets for qcow2/ (see fuzz.cmake).  Included from
# tests/unit/qcow2.cmake.  -UNDEBUG: the decoder's asserts are oracles too.
include(${CMAKE_CURRENT_LIST_DIR}/fuzz.cmake)
foreach(t fuzz-qcow2-parse fuzz-qcow2-stream fuzz-qcow2-image)
  nbdferry_fuzz(${t} LIBRARY qcow2 FLAGS -UNDEBUG)
endforeach()
