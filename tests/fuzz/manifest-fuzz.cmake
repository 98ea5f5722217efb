# Fuzz target for the manifest file's parser (manifest/manifest-file.c; see
# fuzz.cmake).  Included from tests/unit/manifest.cmake.
include(${CMAKE_CURRENT_LIST_DIR}/fuzz.cmake)
nbdferry_fuzz(fuzz-manifest LIBRARY manifest)
