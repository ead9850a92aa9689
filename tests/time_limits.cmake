# The time limit of every CTest test, in seconds (Note [Time limits] in tests/main.cpp). Read by
# tests/CMakeLists.txt for the tests it adds itself, and by case_properties.cmake for each
# doctest case. The limits are for a plain Release build on CI's 2 cores with CTest running 2
# tests at a time; a sanitizer build multiplies them (LOCKSTEP_TEST_TIME_SCALE).

# What the watchdog of tests/main.cpp gets to print the hung case and its stacks before CTest's
# own limit, this much later, kills the process.
set(lockstep_grace_seconds 30)

# Every case not named below: the slowest of them took 15 s in a run of the whole suite (ctest
# -j 2, 440 s, on 2 shared AMD EPYC cores; bf16's million roundings).
set(lockstep_default_limit 60)

# Cases measured slower in that run: a regular expression of their names, and the limit, three
# to five times the longest time (in the comment).
set(lockstep_slow_cases
  "^README: the marked command blocks run" 300  # 101 s
  "^interop: " 150                              # 40 s
  "^corpus: lockstep train exits 2 for every" 120  # 31 s
  "^gpt parity with PyTorch" 120)               # 22 s

# OUT = the limit of the case NAME, times SCALE.
function(lockstep_case_time_limit name scale out)
  set(limit ${lockstep_default_limit})
  set(pairs ${lockstep_slow_cases})
  while(pairs)
    list(POP_FRONT pairs pattern seconds)
    if(name MATCHES "${pattern}")
      set(limit ${seconds})
      break()
    endif()
  endwhile()
  math(EXPR limit "${limit} * ${scale}")
  set(${out} ${limit} PARENT_SCOPE)
endfunction()
