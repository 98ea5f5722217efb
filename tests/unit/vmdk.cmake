# VMDK library unit tests (included from tests/CMakeLists.txt).  Fixtures
# are made at test time by qemu-img and python3-vmdkstream.
set(VMDK_TEST_DIR ${CMAKE_CURRENT_LIST_DIR})

foreach(t format stream synth)
  add_executable(test-vmdk-${t} ${VMDK_TEST_DIR}/test-vmdk-${t}.c)
  target_link_libraries(test-vmdk-${t} PRIVATE vmdk OpenSSL::Crypto)
  add_test(NAME vmdk-${t} COMMAND test-vmdk-${t})
  set_tests_properties(vmdk-${t} PROPERTIES TIMEOUT 600)
endforeach()

# Its fuzz targets: replayed here, libFuzzer with -DFUZZ=ON.
include(${VMDK_TEST_DIR}/../fuzz/vmdk-fuzz.cmake)
