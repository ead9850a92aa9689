#!/usr/bin/env bash
# Installs what is missing, builds into build/ and runs the whole test suite with CTest.
# GPU tests skip with a message when no GPU is usable.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
# PyTorch (CPU) for the GPT parity test, which skips without it.
LOCKSTEP_PACKAGES+=(python3-torch)
install_missing_packages
configure_and_build -DLOCKSTEP_BUILD_TESTS=ON
ctest --test-dir "$LOCKSTEP_BUILD" --output-on-failure -j "$(nproc)" "$@"
