# nbdkit filters used by tools/bench; built, never installed.
#
# nbdkit-usdelay-filter.so: per-write delay with microsecond resolution
# (nbdkit 1.32's delay filter only does whole milliseconds).  tools/bench
# looks for it in ${CMAKE_BINARY_DIR}/tools/nbdkit-filters/ and compiles
# tools/nbdkit-filters/usdelay.c itself when it is not there.
# Included from tools/CMakeLists.txt.
pkg_check_modules(NBDKIT IMPORTED_TARGET nbdkit)
if(NBDKIT_FOUND)
  add_library(nbdkit-usdelay-filter MODULE
              ${CMAKE_CURRENT_LIST_DIR}/usdelay.c)
  target_link_libraries(nbdkit-usdelay-filter PRIVATE PkgConfig::NBDKIT)
  set_target_properties(nbdkit-usdelay-filter PROPERTIES
    PREFIX ""
    OUTPUT_NAME nbdkit-usdelay-filter
    C_VISIBILITY_PRESET hidden
    LIBRARY_OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/nbdkit-filters)
  # nbdkit, not built with a sanitizer, dlopen()s the filter: keep a
  # sanitizer build's -fsanitize flags off it.
  foreach(prop COMPILE_OPTIONS LINK_OPTIONS)
    get_target_property(opts nbdkit-usdelay-filter ${prop})
    if(opts)                     # unset: get_target_property says NOTFOUND
      list(FILTER opts EXCLUDE REGEX "sanitize")
      set_target_properties(nbdkit-usdelay-filter PROPERTIES ${prop} "${opts}")
    endif()
  endforeach()
else()
  message(STATUS "nbdkit-plugin-dev not found: skipping the bench's nbdkit "
                 "filters (tools/bench builds them on demand)")
endif()
