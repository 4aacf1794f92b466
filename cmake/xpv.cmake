# Small helpers shared by every folder.

# xpv_add_unit_test(NAME SOURCES... LIBS ...): one gtest executable, tests discovered into ctest
# with the `unit` label. Test executables go to build/tests so build/bin holds only programs.
function(xpv_add_gtest name label)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gtest_main GTest::gmock)
  gtest_discover_tests(${name} PROPERTIES LABELS ${label} DISCOVERY_TIMEOUT 60)
  # What scripts/test's sanitizer pass runs (labels unit and fuzz): target `unit-fuzz-tests`.
  if(label STREQUAL "unit" OR label STREQUAL "fuzz")
    set_property(GLOBAL APPEND PROPERTY XPV_UNIT_FUZZ_TESTS ${name})
  endif()
endfunction()

function(xpv_add_unit_test name)
  xpv_add_gtest(${name} unit ${ARGN})
endfunction()
