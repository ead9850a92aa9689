#!/usr/bin/env bash
# Installs what is missing, builds into build/, and trains configs/quickstart.yaml on the
# shipped digits dataset. Uses the CPU backend when there is no GPU.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
install_missing_packages
configure_and_build -DLOCKSTEP_BUILD_TESTS=OFF -DLOCKSTEP_BUILD_BENCH=OFF
cd "$LOCKSTEP_ROOT"
"$LOCKSTEP_BUILD/lockstep" devices
"$LOCKSTEP_BUILD/lockstep" train configs/quickstart.yaml "$@"
