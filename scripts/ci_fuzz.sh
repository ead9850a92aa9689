#!/usr/bin/env bash
# Builds the libFuzzer harnesses of tests/fuzz/ with clang into build-fuzz/ and runs each for
# LOCKSTEP_FUZZ_SECONDS (default 20: CI's 90 minutes go mostly to builds and tests), nproc at a time,
# starting from its seeds in tests/corpus/<name>/. Fails on any crash, sanitizer report, leak,
# input that runs over 10 s or single allocation over 256 MB. The input that did it is saved in
# build-fuzz/artifacts/; reproduce with build-fuzz/fuzz/fuzz_<name> FILE, and add it to
# tests/corpus/<name>/ with the fix, so that tests/data/test_corpus_replay.cpp keeps it fixed.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
LOCKSTEP_PACKAGES+=(clang libclang-rt-14-dev)
install_missing_packages

seconds="${LOCKSTEP_FUZZ_SECONDS:-20}"
build="$LOCKSTEP_ROOT/build-fuzz"
start=$SECONDS
cmake -S "$LOCKSTEP_ROOT" -B "$build" -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DLOCKSTEP_FUZZ=ON -DLOCKSTEP_BUILD_TESTS=OFF -DLOCKSTEP_BUILD_BENCH=OFF \
  -DLOCKSTEP_WITH_CUDA=OFF
# The harnesses only (and the library they link), not the CLI.
fuzz_targets=()
for source in "$LOCKSTEP_ROOT"/tests/fuzz/*.cc; do fuzz_targets+=("fuzz_$(basename "$source" .cc)"); done
cmake --build "$build" -j "$(nproc)" --target "${fuzz_targets[@]}"
echo "build-fuzz: built in $((SECONDS - start)) s"

rm -rf "$build/artifacts" "$build/logs"
mkdir -p "$build/artifacts" "$build/logs"
names=()
for source in "$LOCKSTEP_ROOT"/tests/fuzz/*.cc; do
  name="$(basename "$source" .cc)"
  names+=("$name")
  while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do wait -n || true; done
  mkdir -p "$build/corpus/$name"
  # New inputs go to the first corpus folder, so tests/corpus/ is only read. libFuzzer stops
  # itself; the kill is for a run stuck in its own out-of-memory report.
  (
    rc=0
    timeout -s KILL $((seconds + 120)) "$build/fuzz/fuzz_$name" \
      "$build/corpus/$name" "$LOCKSTEP_ROOT/tests/corpus/$name" \
      -max_total_time="$seconds" -timeout=10 -malloc_limit_mb=256 -max_len=65536 \
      -artifact_prefix="$build/artifacts/$name-" -print_final_stats=1 \
      > "$build/logs/$name.log" 2>&1 || rc=$?
    echo "$rc" > "$build/logs/$name.rc"
  ) &
done
wait

failed=0
for name in "${names[@]}"; do
  rc="$(cat "$build/logs/$name.rc")"
  runs="$(grep -o 'stat::number_of_executed_units: [0-9]*' "$build/logs/$name.log" | grep -o '[0-9]*$' || true)"
  if [ "$rc" -eq 0 ]; then
    echo "fuzz_$name: ok, ${runs:-?} inputs in ${seconds} s"
  else
    echo "fuzz_$name: FAILED (exit $rc); log $build/logs/$name.log:"
    tail -n 60 "$build/logs/$name.log"
    failed=1
  fi
done
ls -l "$build/artifacts"
echo "fuzzing: done in $((SECONDS - start)) s"
exit "$failed"
