# libFuzzer targets for vmdk/ (only with -DFUZZ=ON and clang).  Included
# from tests/unit/vmdk.cmake; see format-fuzz.cmake.
include(${CMAKE_CURRENT_LIST_DIR}/format-fuzz.cmake)
nbdferry_format_fuzz(vmdk VMDK TARGETS fuzz-vmdk-parse fuzz-vmdk-stream)
