#!/usr/bin/env bash
# The CTest case install.consumer: installs the build BUILD into a temporary prefix, then
# checks that no installed package file names the build tree, then configures, builds and runs
# the consumer project CONSUMER (tests/install/consumer) against it.
# Usage: run_consumer.sh BUILD CONSUMER CMAKE CXX [PREFIX_PATH LIBRARY_PATH INCLUDE_PATH]
# The last three are the build's own search paths for its dependencies, '|'-separated lists.
set -euo pipefail
build="$1" consumer="$2" cmake="$3" cxx="$4"
prefix_path="${5:-}" library_path="${6:-}" include_path="${7:-}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$cmake" --install "$build" --prefix "$work/prefix" > "$work/install.log" ||
  { cat "$work/install.log"; exit 1; }
# An installed lockstep stands alone: its package files name no folder of the build tree (the
# cuDNN frontend's headers in _deps/ once did), which may be gone when a consumer builds.
if named=$(grep -rlF "$(cd "$build" && pwd -P)" "$work/prefix/lib" "$work/prefix/include" \
    --include='*.cmake' --include='*.hpp'); then
  echo "the installed package names the build tree $build in:"
  echo "$named" | sed "s|$work/prefix/||"
  grep -rnF "$(cd "$build" && pwd -P)" $named | sed "s|$work/prefix/||" | head -5
  exit 1
fi
# Only the installed package: no package registry, no source tree.
"$cmake" -S "$consumer" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_PREFIX_PATH="$work/prefix${prefix_path:+;${prefix_path//|/;}}" \
  -DCMAKE_LIBRARY_PATH="${library_path//|/;}" -DCMAKE_INCLUDE_PATH="${include_path//|/;}" \
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
"$cmake" --build "$work/build" -j 2
"$work/build/consumer"
