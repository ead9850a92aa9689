#!/usr/bin/env bash
# The GPU check of issue 17's overlap, timings and aborts, run after scripts/gpu_check.sh has
# built build-gpu/ (under a minute):
#   1. the "cuda overlap" tests (tests/cuda/test_cuda_overlap.cpp): async peer all-reduces
#      against the sums, timings, and three faults among 4 replicas on one GPU;
#   2. configs/quickstart.yaml on 4 peer replicas of GPU 0, overlap on and off: step time, the
#      all-reduce time and its hidden share (the summary's comm_s and comm_hidden_fraction);
#   3. the CLI fault case: LOCKSTEP_FAULT=2:3:hang (a device wait only the abort ends) with 4
#      peer replicas and trainer.step_timeout_s 1: must exit 1 within 10 s, nobody left behind.
# Prints a short result; exits non-zero on any failure.
#
#   bash scripts/gpu_extra_overlap.sh      # LOCKSTEP_GPU_BUILD: the build folder (build-gpu)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
BUILD="${LOCKSTEP_GPU_BUILD:-$ROOT/build-gpu}"
CLI="$BUILD/lockstep"
TESTS="$BUILD/tests/lockstep_tests"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
status=0

echo "== 1. tests: cuda overlap"
if timeout 40 "$TESTS" -ts='cuda overlap' >"$TMP/tests.log" 2>&1; then
  tail -n 3 "$TMP/tests.log"
else
  cat "$TMP/tests.log"
  echo "FAIL: cuda overlap tests"
  status=1
fi

echo "== 2. quickstart on 4 peer replicas of GPU 0"
for overlap in true false; do
  if timeout 20 "$CLI" train configs/quickstart.yaml --set trainer.backend=cuda \
      --set trainer.devices=[0,0,0,0] --set trainer.overlap=$overlap \
      --set trainer.bucket_cap_mb=0.01 --summary-json "$TMP/s.json" >"$TMP/run.log" 2>&1; then
    python3 - "$TMP/s.json" "$overlap" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"overlap {sys.argv[2]:5}: {s['steps']} steps in {s['wall_s']:.2f} s, "
      f"all-reduce {s['comm_s']:.4f} s per worker, "
      f"{100 * s['comm_hidden_fraction']:.0f}% hidden, {s['buckets']} buckets")
EOF
  else
    tail -n 20 "$TMP/run.log"
    echo "FAIL: quickstart with overlap $overlap"
    status=1
  fi
done

echo "== 3. fault: a device wait only the abort ends (LOCKSTEP_FAULT=2:3:hang)"
start=$(date +%s.%N)
LOCKSTEP_FAULT=2:3:hang timeout -s KILL 30 "$CLI" train configs/quickstart.yaml \
  --set trainer.backend=cuda --set trainer.devices=[0,0,0,0] --set trainer.steps=100 \
  --set trainer.step_timeout_s=1 --set trainer.stop_grace_s=30 >"$TMP/fault.log" 2>&1
code=$?
took=$(python3 -c "import time; print(f'{time.time() - $start:.1f}')")
echo "exit $code after $took s"
grep -m1 "failed:" "$TMP/fault.log" | cut -c1-300
if [[ $code -ne 1 ]] || ! python3 -c "import sys; sys.exit(0 if $took < 10 else 1)"; then
  echo "FAIL: expected exit 1 within 10 s"
  status=1
fi
if grep -q "left running" "$TMP/fault.log"; then
  echo "FAIL: a worker was left behind"
  status=1
fi

[[ $status -eq 0 ]] && echo "gpu_extra_overlap: PASS" || echo "gpu_extra_overlap: FAIL"
exit $status
