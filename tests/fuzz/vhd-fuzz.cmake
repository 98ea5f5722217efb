# Fuzz targets for vhd/ (see fuzz.cmake: replayed over their corpus in
# every build, libFuzzer with -DFUZZ=ON and clang).  Included from
# tests/unit/vhd.cmake.  fuzz-vhd-synth: the export view's synthesizer;
# fuzz-vhd-locator: parent locator paths and the VHD tool's resolution of
# them (imagefile/chain.c, included by the target).
include(${CMAKE_CURRENT_LIST_DIR}/fuzz.cmake)
foreach(t fuzz-vhd-parse fuzz-vhd-stream fuzz-vhd-synth)
  nbdferry_fuzz(${t} LIBRARY vhd QUARANTINE_MB 16)
endforeach()
# imagefile: the rest of the reader that the included chain.c calls.
nbdferry_fuzz(fuzz-vhd-locator LIBRARY vhd LIBS imagefile QUARANTINE_MB 16)
