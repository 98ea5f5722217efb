# fuzz-cli and fuzz-uri (tests/fuzz/cli-uri-fuzz.cmake), with -DFUZZ=ON.
if(FUZZ)
  include(${CMAKE_CURRENT_LIST_DIR}/../fuzz/cli-uri-fuzz.cmake)
endif()
