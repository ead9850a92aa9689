#!/usr/bin/env bash
# The CTest case install.consumer: installs the build BUILD into a temporary prefix, then
# configures, builds and runs the consumer project CONSUMER (tests/install/consumer) against it.
# Usage: run_consumer.sh BUILD CONSUMER CMAKE CXX [PREFIX_PATH LIBRARY_PATH INCLUDE_PATH]
# The last three are the build's own search paths for its dependencies, '|'-separated lists.
set -euo pipefail
build="$1" consumer="$2" cmake="$3" cxx="$4"
prefix_path="${5:-}" library_path="${6:-}" include_path="${7:-}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$cmake" --install "$build" --prefix "$work/prefix" > "$work/install.log" ||
  { cat "$work/install.log"; exit 1; }
# Only the installed package: no package registry, no source tree.
"$cmake" -S "$consumer" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_PREFIX_PATH="$work/prefix${prefix_path:+;${prefix_path//|/;}}" \
  -DCMAKE_LIBRARY_PATH="${library_path//|/;}" -DCMAKE_INCLUDE_PATH="${include_path//|/;}" \
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
"$cmake" --build "$work/build" -j 2
"$work/build/consumer"
