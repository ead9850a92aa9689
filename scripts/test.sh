#!/usr/bin/env bash
# Installs what is missing, builds into build/, checks that every test has a time limit (Note
# [Time limits] in tests/main.cpp) and runs the whole test suite with CTest. Then it
# lists every skipped case with its kind and reason, and fails the run (even when CTest passed)
# when a CTest test ran no doctest case (Note [One case per CTest test] in tests/main.cpp) or a
# case skipped that must run here: GPU and root-only skips pass, a missing package or a CUDA
# backend left unbuilt beside the CUDA toolkit does not (Note [Skip kinds] in tests/skip.hpp).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
LOCKSTEP_PACKAGES+=("${LOCKSTEP_TEST_PACKAGES[@]}")
install_missing_packages
configure_and_build -DLOCKSTEP_BUILD_TESTS=ON

# Every test has a time limit (Note [Time limits] in tests/main.cpp).
cmake -D CTEST=ctest -D BUILD="$LOCKSTEP_BUILD" -P "$LOCKSTEP_ROOT/tests/check_time_limits.cmake"

skip_log="$LOCKSTEP_BUILD/Testing/skipped.tsv"
mkdir -p "$LOCKSTEP_BUILD/Testing"
rm -f "$skip_log"
status=0
empty=""
LOCKSTEP_SKIP_LOG="$skip_log" ctest --test-dir "$LOCKSTEP_BUILD" --output-on-failure \
  -j "$(nproc)" "$@" || status=$?

# doctest's summary of a run that matched no case: "[doctest] test cases: 0 | 0 passed | ...".
log="$LOCKSTEP_BUILD/Testing/Temporary/LastTest.log"
if [ -f "$log" ]; then
  empty=$(awk '/^[0-9]+\/[0-9]+ Test: / { sub(/^[0-9]+\/[0-9]+ Test: /, ""); name = $0 }
               /test cases: +0 \|/ { print "  " name }' "$log")
fi
if [ -n "$empty" ]; then
  echo "CTest tests that ran no doctest case (Note [One case per CTest test]):"
  echo "$empty"
  status=1
fi

if [ -s "$skip_log" ]; then
  echo "skipped cases (Note [Skip kinds] in tests/skip.hpp):"
  sort "$skip_log" | awk -F'\t' '{ printf "  [%s] %s: %s\n", $1, $2, $3 }'
  refused=$(awk -F'\t' '$1 != "gpu" && $1 != "root" && $1 != "platform" && $1 != "setup"' \
            "$skip_log" | wc -l)
  if [ "$refused" -gt 0 ]; then
    echo "$refused skipped case(s) must run on this machine: the lines above not marked gpu," \
         "root, platform or setup"
    status=1
  fi
fi
exit "$status"
