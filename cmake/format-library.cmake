# nbdferry_format_library(NAME SOURCE...): a format library (vhd/, vmdk/,
# qcow2/, vhdx/) from the calling directory's sources: static, the tree's
# root as its public include directory, and its sources kept in the cache
# as <NAME>_SOURCES (upper case) for the fuzz build's instrumented copy
# (tests/fuzz/format-fuzz.cmake).  The caller links its dependencies.
function(nbdferry_format_library name)
  set(srcs)
  foreach(f ${ARGN})
    list(APPEND srcs ${CMAKE_CURRENT_SOURCE_DIR}/${f})
  endforeach()
  string(TOUPPER ${name} upper)
  set(${upper}_SOURCES ${srcs} CACHE INTERNAL
      "${name} library sources (also built instrumented for fuzzing)")
  add_library(${name} STATIC ${srcs})
  target_include_directories(${name} PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/..)
endfunction()
