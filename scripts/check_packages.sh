#!/usr/bin/env bash
# Fails when the build or the tests' Python use a Debian package that the install lists of
# scripts/common.sh do not bring, so that a well-stocked machine cannot hide a missing install
# step (a fresh Debian 12 lacked OpenCL's headers while every CI run was green).
#
# Configures and builds a fresh folder build-packages/ as scripts/test.sh does, then runs the
# tests that use Python (PyTorch parity, Hugging Face interop), all under strace -f; maps every
# file under /usr, /lib and /etc they used (not /usr/local, where the CUDA toolkit lives) to its
# package through dpkg's file lists, and compares with what a fresh machine would have after the
# install step: the Depends/Pre-Depends closure of the install lists and of the base system
# (priority required or important, and essential packages). scripts/check_packages.py says
# which files count. Prints each package outside that set with one file of it.
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
start=$SECONDS
LOCKSTEP_BUILD="$work/build" traced build \
  bash -c 'source "$1/scripts/common.sh" && configure_and_build -DLOCKSTEP_BUILD_TESTS=ON' \
  bash "$LOCKSTEP_ROOT" > "$work/build.log" 2>&1 || { tail -n 40 "$work/build.log"; exit 1; }
echo "check_packages: traced build in $((SECONDS - start)) s"
start=$SECONDS
# Pass or skip, these tests' imports are what counts here; scripts/test.sh judges them.
traced tests ctest --test-dir "$work/build" -R '^(gpt parity|interop)' -j "$(nproc)" \
  > "$work/tests.log" 2>&1 || true
echo "check_packages: traced Python tests in $((SECONDS - start)) s"
/usr/bin/python3 "$LOCKSTEP_ROOT/scripts/check_packages.py" "$work/trace" "$work/build" \
  "${listed[@]}"
