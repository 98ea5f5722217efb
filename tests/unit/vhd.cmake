# VHD library unit tests (included from tests/CMakeLists.txt).
# Fixtures: tests/fixtures/vhd/*.xz, decompressed with xz -dc at test time.
set(VHD_TEST_DIR ${CMAKE_CURRENT_LIST_DIR})
set(VHD_FIXTURE_DIR ${CMAKE_CURRENT_LIST_DIR}/../fixtures/vhd)

add_library(vhd-util STATIC ${VHD_TEST_DIR}/vhd-util.c)
target_compile_definitions(vhd-util PUBLIC
  VHD_FIXTURE_DIR="${VHD_FIXTURE_DIR}")
target_include_directories(vhd-util PUBLIC ${VHD_TEST_DIR})
target_link_libraries(vhd-util PUBLIC vhd OpenSSL::Crypto)

foreach(t format stream synth)
  add_executable(test-vhd-${t} ${VHD_TEST_DIR}/test-vhd-${t}.c)
  target_link_libraries(test-vhd-${t} PRIVATE vhd-util)
endforeach()

add_test(NAME vhd-format COMMAND test-vhd-format)
add_test(NAME vhd-synth COMMAND test-vhd-synth)
foreach(fx tap-dyn-64m tap-diff-64m vhdtool-delta-64m vhdtool-raw-100m3s
           tap-fixed-8m qemu-dyn-10m)
  add_test(NAME vhd-stream-${fx} COMMAND test-vhd-stream ${fx})
  set_tests_properties(vhd-stream-${fx} PROPERTIES TIMEOUT 600)
endforeach()

# The inspector's pytest, tests/test_vhd_tool.py, runs here so that
# `ctest -R vhd` covers it; the catch-all pytest test leaves it out
# (--ignore), so it runs once.
add_test(NAME vhd-tool-pytest
         COMMAND /usr/bin/python3 -m pytest -q -ra -p no:cacheprovider --noconftest
                 ${VHD_TEST_DIR}/../test_vhd_tool.py
         WORKING_DIRECTORY ${VHD_TEST_DIR}/..)
set_tests_properties(vhd-tool-pytest PROPERTIES
  ENVIRONMENT "NBDFERRY_BUILD=${CMAKE_BINARY_DIR}" TIMEOUT 1200)

# Its fuzz targets: replayed here, libFuzzer with -DFUZZ=ON.
include(${VHD_TEST_DIR}/../fuzz/vhd-fuzz.cmake)
