#!/usr/bin/env bash
# The GPU check (scripts/gpu_check.py; bench/GPU.md says what it prints and how to read it).
#
#   bash scripts/gpu_check.sh               # on the lent GPU machine: build, GPU tests, phases
#   bash scripts/gpu_check.sh --rehearse    # here (CI runs it): the same with the GPU phases
#                                           # stubbed, against the build scripts/test.sh made
#   bash scripts/gpu_check.sh --plan        # the phases' order and budgets
#
# Before a run on the GPU machine, once, here: bash scripts/fetch_gpu_deps.sh .devdeps
# Then the device tool's run: command "bash scripts/gpu_check.sh", carry [".devdeps"],
# timeout_s 580. Only the standard library of the machine's python3 is used.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ "${1:-}" = --rehearse ] && [ -z "${LOCKSTEP_GPU_BUILD:-}" ]; then
  export LOCKSTEP_GPU_BUILD="${LOCKSTEP_BUILD:-build}"
fi
exec python3 scripts/gpu_check.py "$@"
