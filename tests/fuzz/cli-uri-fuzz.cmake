# Fuzz targets for the command-line helpers (daemon/cliargs.c,
# daemon/mountpoint.c) and URI redaction (transport/uri.c); see fuzz.cmake.
# Included from tests/unit/cli-uri.cmake.  256 MiB bounds the helpers'
# memory; ASan's default quarantine of freed blocks would fill it alone.
include(${CMAKE_CURRENT_LIST_DIR}/fuzz.cmake)
nbdferry_fuzz(fuzz-cli SOURCES ${CMAKE_SOURCE_DIR}/daemon/cliargs.c
                               ${CMAKE_SOURCE_DIR}/daemon/mountpoint.c
              LIBS PkgConfig::DEPS QUARANTINE_MB 16)   # fuse_opt_parse
nbdferry_fuzz(fuzz-uri SOURCES ${CMAKE_SOURCE_DIR}/transport/uri.c
              QUARANTINE_MB 16)
