# libFuzzer targets for qcow2/ (only with -DFUZZ=ON and clang).  Included
# from tests/unit/qcow2.cmake; see format-fuzz.cmake.
include(${CMAKE_CURRENT_LIST_DIR}/format-fuzz.cmake)
nbdferry_format_fuzz(qcow2 qcow2 TARGETS fuzz-qcow2-parse fuzz-qcow2-stream
                     FLAGS -UNDEBUG)   # the decoder's asserts are oracles too
