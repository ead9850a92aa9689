#!/usr/bin/env bash
# Packing's gain for supervised fine-tuning (issue 44's goal: >= 2.5x), for bench/RESULTS.md:
# configs/sft_tiny.yaml on the shipped conversations (third_party/chat: 52.7 tokens on average
# under chatml) in windows of CONTEXT positions (212 by default: a conversation is about a
# quarter of a window), data.pack true against false, ROUNDS alternating rounds of STEPS steps;
# prints each run's loss-counted tokens per second (the summary's loss_tokens_per_s) and the
# medians' ratio.
#   bench/measure_packing.sh [BUILD_DIR] [ROUNDS] [STEPS] [CONTEXT]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
rounds="${2:-3}"
steps="${3:-60}"
context="${4:-212}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load: $(cut -d' ' -f1-3 /proc/loadavg)"
declare -A rates
for round in $(seq 1 "$rounds"); do
  for pack in true false; do
    "$build/lockstep" train "$root/configs/sft_tiny.yaml" --set data.pack="$pack" \
      --set model.context="$context" --set trainer.steps="$steps" --set trainer.eval_every=0 \
      --set trainer.log_every="$steps" --summary-json "$work/$pack.json" > /dev/null
    rate="$(sed -n 's/.*"loss_tokens_per_s": \([0-9.e+-]*\).*/\1/p' "$work/$pack.json")"
    echo "round $round pack $pack: $rate loss tokens/s"
    rates[$pack]+="$rate "
  done
done
python3 - "${rates[true]}" "${rates[false]}" <<'EOF'
import statistics, sys
packed = statistics.median(map(float, sys.argv[1].split()))
padded = statistics.median(map(float, sys.argv[2].split()))
print(f"median: packed {packed:.0f}, padded {padded:.0f} loss tokens/s: {packed / padded:.2f}x")
EOF
