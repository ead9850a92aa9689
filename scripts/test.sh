#!/usr/bin/env bash
# Installs what is missing, builds into build/ and runs the whole test suite with CTest.
# GPU tests skip with a message when no GPU is usable.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
LOCKSTEP_PACKAGES+=("${LOCKSTEP_TEST_PACKAGES[@]}")
install_missing_packages
configure_and_build -DLOCKSTEP_BUILD_TESTS=ON
ctest --test-dir "$LOCKSTEP_BUILD" --output-on-failure -j "$(nproc)" "$@"
