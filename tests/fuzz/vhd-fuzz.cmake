# Fuzz targets for vhd/ (see fuzz.cmake: replayed over their corpus in
# every build, libFuzzer with -DFUZZ=ON and clang).  Included from
# tests/unit/vhd.cmake.  fuzz-vhd-synth: the export view's synthesizer;
# fuzz-vhd-locator: parent locator paths and the VHD tool's resolution of
# them (vhdfile/vhdfile.c, included by the target).
include(${CMAKE_CURRENT_LIST_DIR}/fuzz.cmake)
foreach(t fuzz-vhd-parse fuzz-vhd-stream fuzz-vhd-synth fuzz-vhd-locator)
  nbdferry_fuzz(${t} LIBRARY vhd QUARANTINE_MB 16)
endforeach()
