# Gives every test case of TEST_EXECUTABLE a CTest label: the folder of tests/ its source file
# lies in (tests/comm/test_all_reduce.cpp: "comm"), so that `ctest -L comm` runs one area (and
# scripts/ci_sanitizers.sh chooses what runs under ThreadSanitizer); and its time limit, from
# time_limits.cmake scaled by TIME_SCALE (Note [Time limits] in tests/main.cpp). Run
# after each build of the test program (tests/CMakeLists.txt), like doctest's own discovery, and
# writes OUTPUT: set_tests_properties() lines that CTest reads after doctest's add_test() lines.
#
# doctest's XML listing names each case's file. Names never contain ';' (tests/main.cpp refuses
# them), and the bracket arguments below take every other character as it is.
include("${CMAKE_CURRENT_LIST_DIR}/time_limits.cmake")
execute_process(
  COMMAND "${TEST_EXECUTABLE}" --list-test-cases --reporters=xml
  OUTPUT_VARIABLE listing
  RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "${TEST_EXECUTABLE} --list-test-cases --reporters=xml: exit ${result}")
endif()
# A loop over matches rather than a CMake list: a name may hold '[' or ']', which change how a
# list splits.
set(rest "${listing}")
set(script "")
while(rest MATCHES "<TestCase name=\"([^\"]*)\"( testsuite=\"[^\"]*\")? filename=\"([^\"]*)\"")
  set(name "${CMAKE_MATCH_1}")
  set(file "${CMAKE_MATCH_3}")
  string(FIND "${rest}" "${CMAKE_MATCH_0}" at)
  string(LENGTH "${CMAKE_MATCH_0}" length)
  math(EXPR next "${at} + ${length}")
  string(SUBSTRING "${rest}" ${next} -1 rest)
  # XML's five escapes, &amp; last.
  string(REPLACE "&quot;" "\"" name "${name}")
  string(REPLACE "&apos;" "'" name "${name}")
  string(REPLACE "&lt;" "<" name "${name}")
  string(REPLACE "&gt;" ">" name "${name}")
  string(REPLACE "&amp;" "&" name "${name}")
  # A case of the harness itself (tests/main.cpp) is labelled "harness".
  if(file MATCHES "(^|/)tests/([^/]+)/[^/]+$")
    set(label "${CMAKE_MATCH_2}")
  elseif(file MATCHES "(^|/)tests/[^/]+$")
    set(label harness)
  else()
    message(FATAL_ERROR "${TEST_EXECUTABLE}: test case '${name}' is in ${file}, outside tests/")
  endif()
  lockstep_case_time_limit("${name}" "${TIME_SCALE}" limit)
  math(EXPR timeout "${limit} + ${lockstep_grace_seconds}")
  string(APPEND script "set_tests_properties([==[${name}]==] PROPERTIES LABELS ${label} "
    "TIMEOUT ${timeout} ENVIRONMENT_MODIFICATION LOCKSTEP_CASE_TIMEOUT=set:${limit})\n")
endwhile()
if(script STREQUAL "")
  message(FATAL_ERROR "${TEST_EXECUTABLE} --list-test-cases --reporters=xml: no test case read")
endif()
file(WRITE "${OUTPUT}" "${script}")
