# libFuzzer target for vhdx/ (only with -DFUZZ=ON and clang).  Included
# from tests/unit/vhdx.cmake; see format-fuzz.cmake.
include(${CMAKE_CURRENT_LIST_DIR}/format-fuzz.cmake)
nbdferry_format_fuzz(vhdx VHDX TARGETS fuzz-vhdx-stream RSS_MB 512)
