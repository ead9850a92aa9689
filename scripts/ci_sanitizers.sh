#!/usr/bin/env bash
# Builds the CPU test suite twice and runs it under each: build-asan/ with AddressSanitizer and
# UndefinedBehaviorSanitizer, build-tsan/ with ThreadSanitizer. Any report fails the test that
# made it, and so this script. oneTBB is not instrumented (Debian's build), so TSan cannot see
# its synchronisation: our parallel loops tell TSan their fork and join (Note [TSan and oneTBB]
# in src/common/tsan_fork_join.hpp), and third_party/tsan.supp silences only what oneDNN's
# primitive cache makes TSan report. Every test has a time limit, scaled for the sanitizer
# (Note [Time limits] in tests/main.cpp).
# MPI is left out (Open MPI is not instrumented either, and its own allocations read as leaks):
# the multi-process code paths run here through in-process fake processes
# (tests/comm/loopback_processes.hpp); the mpirun tests run in scripts/test.sh.
#
# Left out of both suites: the tests that compare with PyTorch, transformers and tiktoken (label
# interop, and the gpt parity cases). They spend their time in Python, and the code of ours they
# run is run by the io, model, text and cli tests too. The Python module's tests run once, in
# the ASan suite: the interpreter with ASan's runtime preloaded and Python's allocator set to
# malloc (tests/CMakeLists.txt), for the buffers the module borrows from numpy and the runs it
# makes with the GIL released. The TSan build has only the cases whose code runs our own threads
# against each other (the folders comm, data, io, train, cli and two_process of tests/,
# LOCKSTEP_TEST_DIRS: workers, communicators, loaders, checkpoint writers and their locks, whole
# runs of the trainer, the CLI's signal handlers against the trainer, two processes over
# sockets): the kernels' cases (cpu, model, text) take minutes under TSan for loops whose tasks
# never meet; config has no threads. ASan and UBSan run them all. CI's limit is 90 minutes.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
install_missing_packages

# NAME SANITIZER TEST_DIRS [CMAKE ARGS...]: configure, build and test $LOCKSTEP_ROOT/NAME, with
# the cases of the folders of tests/ in TEST_DIRS (a CMake list; all when empty). -O1 keeps the
# build fast and the stacks readable; -g1 gives line numbers.
sanitized_suite() {
  local dir="$LOCKSTEP_ROOT/$1" sanitizer="$2" test_dirs="${3:-}"
  local start=$SECONDS
  shift 3
  cmake -S "$LOCKSTEP_ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DLOCKSTEP_SANITIZE="$sanitizer" \
    -DLOCKSTEP_WITH_CUDA=OFF -DLOCKSTEP_WITH_MPI=OFF -DLOCKSTEP_BUILD_BENCH=OFF \
    -DLOCKSTEP_BUILD_TESTS=ON -DLOCKSTEP_TEST_DIRS="$test_dirs" "$@"
  cmake --build "$dir" -j "$(nproc)"
  echo "$(basename "$dir"): built in $((SECONDS - start)) s"
  cmake -D CTEST=ctest -D BUILD="$dir" -P "$LOCKSTEP_ROOT/tests/check_time_limits.cmake"
  ctest --test-dir "$dir" --output-on-failure -j "$(nproc)" -LE '^interop$' \
    -E '^gpt parity with PyTorch'
  echo "$(basename "$dir"): built and tested in $((SECONDS - start)) s"
}

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:check_initialization_order=1:strict_init_order=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
# The Python module too (LOCKSTEP_BUILD_PYTHON=ON: its absence fails the configure), with the
# nanobind scripts/test.sh fetched.
fetch_wheel nanobind "$NANOBIND_VERSION" "$LOCKSTEP_BUILD/_deps/nanobind" nanobind/
sanitized_suite build-asan address "" -DLOCKSTEP_BUILD_PYTHON=ON \
  -Dnanobind_DIR="$LOCKSTEP_BUILD/_deps/nanobind/nanobind/cmake" \
  -DPython_EXECUTABLE="$LOCKSTEP_PYTHON"

export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:history_size=7:suppressions=$LOCKSTEP_ROOT/third_party/tsan.supp}"
sanitized_suite build-tsan thread "comm;data;io;train;cli;two_process"
