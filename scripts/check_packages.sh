#!/usr/bin/env bash
# Fails when the build, the tests' Python or a program a test runs come from a Debian package
# that the install lists of scripts/common.sh do not bring, so that a well-stocked machine cannot
# hide a missing install step (a fresh Debian 12 lacked OpenCL's headers while every CI run was
# green).
#
# What the build used, three ways, each the cheapest that sees all of it:
# - a fresh configure of build-packages/, as scripts/test.sh configures, under strace -f (CMake's
#   find_path and find_library only stat what they find, and FindX modules run programs);
# - every compile's headers, from the dependency files the compiler writes beside each object of
#   the build folder scripts/test.sh built (CMake compiles with -MD: the same files a trace of
#   the compiler would show, at no cost); it is built here, as test.sh does, if missing;
# - every link's libraries, from its link line in that folder.
# And one test per Python environment (PyTorch parity, Hugging Face and tiktoken interop) runs
# under strace -f, and a virtual environment is made as they make theirs; every other test runs
# under strace -f too, for the programs it executes (execve only: the suite's time, not more). A
# trace that fails (strace cannot start, or ends without its command) fails the check; what the
# tests themselves say is scripts/test.sh's to judge. scripts/check_packages.py
# maps every file under /usr, /lib and /etc (not /usr/local, where the CUDA toolkit lives) to its
# package through dpkg's file lists, and compares with what a fresh machine would have after the
# install step: the Depends/Pre-Depends closure of the install lists and of the base system
# (priority required or important, and essential packages). It prints each package outside that
# set with one file of it.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
listed=("${LOCKSTEP_PACKAGES[@]}" "${LOCKSTEP_TEST_PACKAGES[@]}")
LOCKSTEP_PACKAGES=("${listed[@]}" strace)
install_missing_packages

work="$LOCKSTEP_ROOT/build-packages"
rm -rf "$work"
mkdir -p "$work/trace"
traced() {
  local name="$1"
  shift
  strace -f -qq -s 4096 -e status=successful -o "$work/trace/$name" \
    -e trace=execve,open,openat,stat,lstat,newfstatat,statx,access,faccessat,faccessat2,readlink,readlinkat \
    "$@"
}
# traced_tests TRACE LOG [STRACE OPTIONS...] -- CTEST ARGS...: runs ctest on the build under strace
# into trace/TRACE, its output into LOG. Fails when the trace does, whatever the tests do.
traced_tests() {
  local name="$1" log="$2" options=()
  shift 2
  while [ "$1" != "--" ]; do options+=("$1"); shift; done
  shift
  rm -f "$log" "$log.rc"
  if ! strace -f -qq -s 4096 -e status=successful -o "$work/trace/$name" "${options[@]}" \
      bash -c 'ctest --test-dir "$1" -j "$2" "${@:4}" > "$3" 2>&1; echo $? > "$3.rc"' \
      tests "$LOCKSTEP_BUILD" "$(nproc)" "$log" "$@" || [ ! -s "$log.rc" ]; then
    echo "check_packages: strace failed on ctest $*; its output:"
    tail -n 20 "$log" 2> /dev/null || true
    exit 1
  fi
  echo "check_packages: traced ctest $* (tests: $(grep -o '[0-9]*% tests passed.*' "$log"))"
}
start=$SECONDS
traced configure cmake -S "$LOCKSTEP_ROOT" -B "$work/configure" -DCMAKE_BUILD_TYPE=Release \
  -DLOCKSTEP_BUILD_TESTS=ON > "$work/configure.log" 2>&1 ||
  { tail -n 40 "$work/configure.log"; exit 1; }
[ -x "$LOCKSTEP_BUILD/tests/lockstep_tests" ] || configure_and_build -DLOCKSTEP_BUILD_TESTS=ON
echo "check_packages: traced configure in $((SECONDS - start)) s"
start=$SECONDS
# The interop tests' environments exist already (scripts/test.sh made them): making one again,
# offline, is what reads python3-venv's files (ensurepip and its wheels).
traced tests-venv /usr/bin/python3 -m venv "$work/venv" > "$work/venv.log" 2>&1 ||
  { cat "$work/venv.log"; exit 1; }
# Pass or skip, these tests' imports are what counts here; scripts/test.sh judges them. One case
# per Python environment, each the one that imports the most of it: the system's PyTorch (gpt
# parity), the transformers environment with PyTorch (--init-from a transformers GPT-2), the
# tiktoken environment, and the Python module's (numpy, pytest); the other cases of each import
# a subset (all of them took 4 minutes).
python_tests='^(gpt parity with PyTorch: the loss|interop: --init-from a transformers|interop: lockstep tokenize writes|python: test_data.py)'
traced_tests tests "$work/tests.log" \
  -e trace=execve,open,openat,stat,lstat,newfstatat,statx,access,faccessat,faccessat2,readlink,readlinkat \
  -- -R "$python_tests"
echo "check_packages: traced Python tests in $((SECONDS - start)) s"
start=$SECONDS
traced_tests tests-programs "$work/tests-programs.log" --seccomp-bpf -e trace=execve \
  -- -E "$python_tests"
echo "check_packages: traced the programs of every other test in $((SECONDS - start)) s"
/usr/bin/python3 "$LOCKSTEP_ROOT/scripts/check_packages.py" "$work/trace" "$LOCKSTEP_BUILD" \
  "${listed[@]}"
