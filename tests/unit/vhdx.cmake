# VHDX library unit tests (included from tests/CMakeLists.txt).  Files are
# made at test time by qemu-img, and built by the test for what qemu-img
# cannot write.
add_executable(test-vhdx-stream ${CMAKE_CURRENT_LIST_DIR}/test-vhdx-stream.c)
target_link_libraries(test-vhdx-stream PRIVATE vhdx)
add_test(NAME vhdx-stream COMMAND test-vhdx-stream)
set_tests_properties(vhdx-stream PROPERTIES TIMEOUT 600)

# Its fuzz targets: replayed here, libFuzzer with -DFUZZ=ON.
include(${CMAKE_CURRENT_LIST_DIR}/../fuzz/vhdx-fuzz.cmake)

add_executable(test-vhdx-synth ${CMAKE_CURRENT_LIST_DIR}/test-vhdx-synth.c)
target_link_libraries(test-vhdx-synth PRIVATE vhdx)
add_test(NAME vhdx-synth COMMAND test-vhdx-synth)
set_tests_properties(vhdx-synth PROPERTIES TIMEOUT 600)

# The integration tests' builder of VHDX files qemu-img cannot write.
add_executable(vhdx-mkfile ${CMAKE_CURRENT_LIST_DIR}/vhdx-mkfile.c)
target_link_libraries(vhdx-mkfile PRIVATE vhdx)

add_executable(test-vhdx-log ${CMAKE_CURRENT_LIST_DIR}/test-vhdx-log.c)
target_link_libraries(test-vhdx-log PRIVATE vhdx)
add_test(NAME vhdx-log COMMAND test-vhdx-log)

add_executable(test-vhdx-format ${CMAKE_CURRENT_LIST_DIR}/test-vhdx-format.c)
target_link_libraries(test-vhdx-format PRIVATE vhdx)
add_test(NAME vhdx-format COMMAND test-vhdx-format)
