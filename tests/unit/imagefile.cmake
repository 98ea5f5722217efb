# imagefile/ unit test (included from tests/CMakeLists.txt): images of
# every format made at test time by qemu-img and qemu-io, and the VHD
# fixtures' differencing chain (tests/fixtures/vhd), read through the one
# reader and checked against what qemu-img converts them to.
add_executable(test-imagefile-read ${CMAKE_CURRENT_LIST_DIR}/test-imagefile-read.c)
target_compile_definitions(test-imagefile-read PRIVATE
  VHD_FIXTURE_DIR="${CMAKE_CURRENT_LIST_DIR}/../fixtures/vhd")
target_link_libraries(test-imagefile-read PRIVATE imagefile vhd vmdk qcow2 vhdx)
add_test(NAME imagefile-read COMMAND test-imagefile-read)
set_tests_properties(imagefile-read PROPERTIES TIMEOUT 600)
