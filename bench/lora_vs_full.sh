#!/usr/bin/env bash
# LoRA against a full fine-tune of configs/smollm2_135m.yaml's shape on the CPU (issue 44's
# goal): gradient bytes per step and optimiser state from the run's summary (the memory plan),
# and throughput side by side, N workers, a short context and batch so that it fits a small
# machine. Random tokens and a random base: the figures are of the step, not of learning.
#   bench/lora_vs_full.sh BUILD_DIR [WORKERS [CONTEXT [BATCH [STEPS [RANK]]]]]
set -euo pipefail
build=${1:?usage: bench/lora_vs_full.sh BUILD_DIR [WORKERS [CONTEXT [BATCH [STEPS [RANK]]]]]}
workers=${2:-2} context=${3:-64} batch=${4:-2} steps=${5:-8} rank=${6:-16}
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -c "
import random, array
random.seed(0)
array.array('H', (random.randrange(49152) for _ in range(200000))).tofile(open('$work/tokens.bin', 'wb'))"
common=(--set data.path="$work/tokens.bin" --set data.eval_path= --set data.eval_fraction=0.05
        --set model.context="$context" --set data.batch_size="$batch" --set trainer.steps="$steps"
        --set trainer.devices="$workers" --set trainer.backend=cpu --set trainer.precision=fp32
        --set trainer.checkpoint.dir= --set trainer.eval_every=0 --set trainer.log_every="$steps")
run() {  # NAME, then extra --set flags
  local name=$1; shift
  "$build/lockstep" train "$here/configs/smollm2_135m.yaml" "${common[@]}" "$@" \
    --summary-json "$work/$name.json" > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
}
run full
run lora --set model.lora.rank="$rank" --set model.lora.alpha=$((2 * rank)) --set model.lora.targets=all
python3 - "$work" "$workers" "$context" "$batch" "$steps" "$rank" <<'PY'
import json, sys
work, workers, context, batch, steps, rank = sys.argv[1:]
full, lora = (json.load(open(f"{work}/{n}.json")) for n in ("full", "lora"))
print(f"SmolLM2-135M shape, fp32 CPU, {workers} workers, context {context}, batch {batch} per "
      f"worker, {steps} steps; LoRA rank {rank} on q,k,v,o,gate,up,down")
print(f"{'':28}{'full':>16}{'LoRA':>16}{'ratio':>10}")
rows = [("trainable parameters", full["trainable_parameters"], lora["trainable_parameters"]),
        ("gradient bytes per step", full["gradient_bytes_per_step"], lora["gradient_bytes_per_step"]),
        ("optimiser state bytes", full["planned_optimizer_state_bytes"], lora["planned_optimizer_state_bytes"]),
        ("tokens/s", full["tokens_per_s"], lora["tokens_per_s"])]
for name, f, l in rows:
    print(f"{name:28}{f:16.6g}{l:16.6g}{(l / f if name == 'tokens/s' else f / l):10.1f}x")
print(f"LoRA summary's full fine-tune plan: {lora['full_finetune']}")
PY
