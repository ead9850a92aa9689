#!/usr/bin/env bash
# Builds the CPU test suite twice and runs it under each: build-asan/ with AddressSanitizer and
# UndefinedBehaviorSanitizer, build-tsan/ with ThreadSanitizer. Any report fails the test that
# made it, and so this script. oneTBB is not instrumented (Debian's build), so TSan cannot see
# its synchronisation; third_party/tsan.supp silences what TSan reports inside it, and only that.
# MPI is left out (Open MPI is not instrumented either, and its own allocations read as leaks):
# the multi-process code paths run here through in-process fake processes
# (tests/comm/loopback_processes.hpp); the mpirun tests run in scripts/test.sh.
#
# Left out of both suites: the tests that compare with PyTorch, transformers and tiktoken (label
# interop, and the gpt parity cases). They spend their time in Python, and the code of ours they
# run is run by the io, model, text and cli tests too. The TSan build has only the cases whose
# code runs our own threads against each other in this process (the folders comm, data, io,
# train of tests/, LOCKSTEP_TEST_DIRS: workers, communicators, loaders, checkpoint writers and
# their locks, whole runs of the trainer): the kernels' cases (cpu, model, text) run their
# parallel loops on oneTBB, whose synchronisation TSan cannot see and whose reports
# third_party/tsan.supp therefore silences, so under TSan they take minutes and can report
# nothing; config has no threads; cli runs the same trainer again through the binary, in
# processes of their own (about 100 s of CI's 40 minutes under TSan, for threads the train cases
# already run). ASan and UBSan run them all.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
install_missing_packages

# NAME SANITIZER [TEST DIRS]: configure, build and test $LOCKSTEP_ROOT/NAME, with the cases of
# the folders of tests/ in TEST DIRS (a CMake list; all when empty). -O1 keeps the build fast and
# the stacks readable; -g1 gives line numbers.
sanitized_suite() {
  local dir="$LOCKSTEP_ROOT/$1" sanitizer="$2" test_dirs="${3:-}"
  local start=$SECONDS
  cmake -S "$LOCKSTEP_ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DLOCKSTEP_SANITIZE="$sanitizer" \
    -DLOCKSTEP_WITH_CUDA=OFF -DLOCKSTEP_WITH_MPI=OFF -DLOCKSTEP_BUILD_BENCH=OFF \
    -DLOCKSTEP_BUILD_TESTS=ON -DLOCKSTEP_TEST_DIRS="$test_dirs"
  cmake --build "$dir" -j "$(nproc)"
  ctest --test-dir "$dir" --output-on-failure -j "$(nproc)" -LE '^interop$' \
    -E '^gpt parity with PyTorch'
  echo "$(basename "$dir"): built and tested in $((SECONDS - start)) s"
}

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:check_initialization_order=1:strict_init_order=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
sanitized_suite build-asan address

export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:history_size=7:suppressions=$LOCKSTEP_ROOT/third_party/tsan.supp}"
sanitized_suite build-tsan thread "comm;data;io;train"
