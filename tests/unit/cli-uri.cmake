# fuzz-cli and fuzz-uri (tests/fuzz/cli-uri-fuzz.cmake): replayed over
# their corpus in every build, libFuzzer with -DFUZZ=ON.
include(${CMAKE_CURRENT_LIST_DIR}/../fuzz/cli-uri-fuzz.cmake)
