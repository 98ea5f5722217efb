# qcow2 library unit tests (included from tests/CMakeLists.txt).  Images
# are made at test time by qemu-img and qemu-io.
set(QCOW2_TEST_DIR ${CMAKE_CURRENT_LIST_DIR})

foreach(t format stream synth refused image)
  if(EXISTS ${QCOW2_TEST_DIR}/test-qcow2-${t}.c)
    add_executable(test-qcow2-${t} ${QCOW2_TEST_DIR}/test-qcow2-${t}.c)
    target_link_libraries(test-qcow2-${t} PRIVATE qcow2)
    add_test(NAME qcow2-${t} COMMAND test-qcow2-${t})
    set_tests_properties(qcow2-${t} PROPERTIES TIMEOUT 600)
  endif()
endforeach()

# Its fuzz targets: replayed here, libFuzzer with -DFUZZ=ON.
include(${QCOW2_TEST_DIR}/../fuzz/qcow2-fuzz.cmake)
