#!/usr/bin/env bash
# Issue 17, items 1-2 on the GPU: the CUDA tests of the step record's ops against the CPU (the
# loss accumulated on the device, grain sums, step_control, the optimisers reading the clip
# factor and the skip flag), then gpt_tiny on one GPU for 30 steps with accumulate_steps 4,
# clipping and on_nonfinite: skip, whose summary must report host_syncs_per_step 1; from its
# trace, step 1's time against the median later step, and the warm-up's (Note [Warm-up] in
# src/train/worker_loop.hpp; not yet measured on a GPU).
#
#   bash scripts/gpu_extra_sync.sh    # from the repository root, after scripts/gpu_check.sh
#
# Exit status: 0 when the tests pass and the run reports one host sync per step; 1 otherwise.
set -uo pipefail
BUILD="${LOCKSTEP_GPU_BUILD:-build-gpu}"
OUT="${OUT:-./gpu-check-out}"
mkdir -p "$OUT" || exit 1
OUT="$(cd "$OUT" && pwd)"
tests="$(find "$BUILD" -name lockstep_tests -type f -perm -u+x | head -1)"
if [ -z "$tests" ] || [ ! -x "$BUILD/lockstep" ]; then
  echo "gpu_extra_sync: no lockstep_tests or lockstep under $BUILD; run scripts/gpu_check.sh first"
  exit 1
fi
status=0
if timeout 60 "$tests" \
  -tc='*softmax_cross_entropy*,*sum_squares_grains*,step_control*,sgd_step and adamw_step*' \
  > "$OUT/gpu_extra_sync_tests.log" 2>&1; then
  echo "gpu_extra_sync: step record ops on the GPU: passed ($(grep -o '[0-9]* passed' \
    "$OUT/gpu_extra_sync_tests.log" | tail -1) assertions)"
else
  echo "gpu_extra_sync: step record ops on the GPU: FAILED (see $OUT/gpu_extra_sync_tests.log)"
  status=1
fi
json="$OUT/gpu_extra_sync_summary.json"
if timeout 120 "$BUILD/lockstep" train configs/gpt_tiny.yaml --set trainer.backend=cuda \
  --set trainer.devices=1 --set trainer.steps=30 --set trainer.accumulate_steps=4 \
  --set optimizer.clip_grad_norm=1.0 --set trainer.on_nonfinite=skip \
  --set trainer.eval_every=0 --set trainer.checkpoint.dir="$OUT/gpu_extra_sync_ckpt" \
  --set trainer.trace="$OUT/gpu_extra_sync_trace.json" \
  --summary-json "$json" > "$OUT/gpu_extra_sync_train.log" 2>&1; then
  syncs="$(grep -o '"host_syncs_per_step": [0-9]*' "$json" | grep -o '[0-9]*$')"
  echo "gpu_extra_sync: gpt_tiny on cuda:0 (accumulate 4, clip 1.0, skip): host_syncs_per_step ${syncs:-missing}"
  [ "${syncs:-}" = "1" ] || status=1
  python3 - "$OUT/gpu_extra_sync_trace.json" <<'PY' || echo "gpu_extra_sync: no step times"
import collections, json, statistics, sys
events = [e for e in json.load(open(sys.argv[1]))["traceEvents"]
          if e.get("ph") == "X" and e.get("tid") == 0 and e.get("pid") == 0]
span = collections.defaultdict(lambda: [float("inf"), 0.0])  # step: first start, last end (us)
for e in events:
    step = (e.get("args") or {}).get("step")
    if step is not None and e["name"] in ("forward", "backward", "optimizer"):
        span[step] = [min(span[step][0], e["ts"]), max(span[step][1], e["ts"] + e["dur"])]
ms = {k: (v[1] - v[0]) / 1e3 for k, v in span.items()}
warm = [e["dur"] / 1e3 for e in events if e["name"] == "warm-up"]
print(f"gpu_extra_sync: step 1 {ms[1]:.2f} ms, median later step "
      f"{statistics.median(v for k, v in ms.items() if k > 1):.2f} ms, warm-up "
      f"{warm[0] if warm else float('nan'):.2f} ms")
PY
else
  echo "gpu_extra_sync: gpt_tiny on cuda:0: FAILED (see $OUT/gpu_extra_sync_train.log)"
  status=1
fi
exit "$status"
