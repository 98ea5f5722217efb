# VHDX library unit tests (included from tests/CMakeLists.txt).  Files are
# made at test time by qemu-img, and built by the test for what qemu-img
# cannot write.
add_executable(vhdx-test-stream ${CMAKE_CURRENT_LIST_DIR}/vhdx-test-stream.c)
target_link_libraries(vhdx-test-stream PRIVATE vhdx)
add_test(NAME vhdx-stream COMMAND vhdx-test-stream)
set_tests_properties(vhdx-stream PROPERTIES TIMEOUT 600)

# Its fuzz targets: replayed here, libFuzzer with -DFUZZ=ON.
include(${CMAKE_CURRENT_LIST_DIR}/../fuzz/vhdx-fuzz.cmake)

add_executable(vhdx-test-synth ${CMAKE_CURRENT_LIST_DIR}/vhdx-test-synth.c)
target_link_libraries(vhdx-test-synth PRIVATE vhdx)
add_test(NAME vhdx-synth COMMAND vhdx-test-synth)
set_tests_properties(vhdx-synth PROPERTIES TIMEOUT 600)

# The integration tests' builder of VHDX files qemu-img cannot write.
add_executable(vhdx-mkfile ${CMAKE_CURRENT_LIST_DIR}/vhdx-mkfile.c)
target_link_libraries(vhdx-mkfile PRIVATE vhdx)

add_executable(vhdx-test-log ${CMAKE_CURRENT_LIST_DIR}/vhdx-test-log.c)
target_link_libraries(vhdx-test-log PRIVATE vhdx)
add_test(NAME vhdx-log COMMAND vhdx-test-log)

add_executable(vhdx-test-format ${CMAKE_CURRENT_LIST_DIR}/vhdx-test-format.c)
target_link_libraries(vhdx-test-format PRIVATE vhdx)
add_test(NAME vhdx-format COMMAND vhdx-test-format)
