# libFuzzer targets for vhd/ (only with -DFUZZ=ON and clang).  Included
# from tests/unit/vhd.cmake; see format-fuzz.cmake.  fuzz-vhd-synth: the
# export view's synthesizer; fuzz-vhd-locator: parent locator paths and
# the VHD tool's resolution of them (vhdfile/vhdfile.c).
include(${CMAKE_CURRENT_LIST_DIR}/format-fuzz.cmake)
nbdferry_format_fuzz(vhd VHD TARGETS fuzz-vhd-parse fuzz-vhd-stream
                     fuzz-vhd-synth fuzz-vhd-locator QUARANTINE_MB 16)
