# Fuzz target for the --digest=blkhash option value and the blkhash
# library, lanes included (digest/blkhash.c, digest/sha256x.c; see
# fuzz.cmake).  Included from tests/unit/blkhash.cmake.
include(${CMAKE_CURRENT_LIST_DIR}/fuzz.cmake)
nbdferry_fuzz(fuzz-blkhash LIBRARY blkhash RSS_MB 2048)
