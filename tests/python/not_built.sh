#!/usr/bin/env bash
# Stands for the Python module's tests in a build without the module: says why and is skipped as
# "missing" (Note [Skip kinds] in tests/skip.hpp), which scripts/test.sh refuses.
#   tests/python/not_built.sh WHY
echo "skipping (missing): the Python module was not built: $1"
[ -n "${LOCKSTEP_SKIP_LOG:-}" ] &&
  printf 'missing\tpython: the module is built\tnot built: %s\n' "$1" >> "$LOCKSTEP_SKIP_LOG"
exit 77
