# nbdkit plugins the integration tests serve from; built, never installed.
# Included from tests/CMakeLists.txt.
#
# nbdkit-jitter-plugin.so:    RAM disk, random delay on every write (ordering)
# nbdkit-flushfail-plugin.so: file disk whose flush fails on demand
# nbdkit-liar-plugin.so:      RAM disk that drops zeroes, flips a byte, fails reads
# nbdkit-shortext-plugin.so:  RAM disk whose block status answers short
#
# tests/lib/servers.py finds them in ${CMAKE_BINARY_DIR}/tests/nbdkit-plugins/;
# a test that needs one fails when it is missing (install nbdkit-plugin-dev,
# see scripts/install-deps).
pkg_check_modules(NBDKIT IMPORTED_TARGET nbdkit)
if(NBDKIT_FOUND)
  foreach(p jitter flushfail liar shortext)
    add_library(nbdkit-${p}-plugin MODULE
                ${CMAKE_CURRENT_LIST_DIR}/nbdkit-plugins/${p}.c)
    target_link_libraries(nbdkit-${p}-plugin PRIVATE PkgConfig::NBDKIT)
    set_target_properties(nbdkit-${p}-plugin PROPERTIES
      PREFIX ""
      OUTPUT_NAME nbdkit-${p}-plugin
      C_VISIBILITY_PRESET hidden
      LIBRARY_OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/nbdkit-plugins)
    # nbdkit, not built with a sanitizer, dlopen()s the plugin: a sanitizer
    # build's -fsanitize flags would make it refuse to load (ASan runtime
    # "does not come first").  The plugin keeps every other flag.
    foreach(prop COMPILE_OPTIONS LINK_OPTIONS)
      get_target_property(opts nbdkit-${p}-plugin ${prop})
      if(opts)                     # unset: get_target_property says NOTFOUND
        list(FILTER opts EXCLUDE REGEX "sanitize")
        set_target_properties(nbdkit-${p}-plugin PROPERTIES ${prop} "${opts}")
      endif()
    endforeach()
  endforeach()
else()
  message(WARNING "nbdkit-plugin-dev not found: the tests' nbdkit plugins "
                  "are not built and the tests that need them will fail")
endif()
