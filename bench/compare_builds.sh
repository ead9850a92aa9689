#!/usr/bin/env bash
# Two builds of lockstep against each other, bit for bit: short fixed-seed trainings of the tiny
# configs on the CPU backend across precision x attention x recompute (GPT-2 and Llama blocks),
# LoRA with and without dropout, and gradient accumulation, each ending with a checkpoint; the
# checkpoints (parameters and optimiser state) must be equal byte for byte, and so must every
# step's loss and gradient norm in the metrics. For a change meant to move no bit (a layout of
# buffers, a refactor).
#
#   bench/compare_builds.sh OLD_LOCKSTEP NEW_LOCKSTEP [WORK_DIR]
#
# Exits 1 when any run differs (each is named), 0 when all agree.
set -euo pipefail
old=${1:?usage: compare_builds.sh OLD_LOCKSTEP NEW_LOCKSTEP [WORK_DIR]}
new=${2:?usage: compare_builds.sh OLD_LOCKSTEP NEW_LOCKSTEP [WORK_DIR]}
work=${3:-$(mktemp -d)}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$work"

# Every logged step's loss and gradient norm in a metrics file (the other fields are times).
losses() {
  grep '"kind": "step"' "$1" | sed -E 's/.*"loss": ([^,]*),.*"grad_norm": ([^,]*),.*/\1 \2/'
}

# run NAME CONFIG SETTINGS...: both builds, then the comparison.
failures=0 runs=0
run() {
  local name=$1 config=$2
  shift 2
  local sets=(--set trainer.devices=1 --set trainer.eval_every=0 --set trainer.log_every=1
              --set trainer.check_replicas_every=0 --set trainer.checkpoint.every_steps=0
              --set trainer.checkpoint.overwrite=true --set trainer.backend=cpu)
  for s in "$@"; do sets+=(--set "$s"); done
  for which in old new; do
    local bin=$old
    [ "$which" = new ] && bin=$new
    # The same paths for both: the optimiser state records the config, paths included.
    rm -rf "$work/run" "$work/$name.$which"
    "$bin" train "$root/configs/$config" "${sets[@]}" \
      --set trainer.metrics="$work/run/metrics.jsonl" \
      --set trainer.checkpoint.dir="$work/run/ck" > "$work/$name.$which.log" 2>&1 || {
        echo "FAIL $name: $which run exited $? (see $work/$name.$which.log)"
        failures=$((failures + 1))
        return
      }
    mv "$work/run" "$work/$name.$which"
  done
  runs=$((runs + 1))
  local diff=""
  for f in "$work/$name.old/ck"/step_*; do
    cmp -s "$f" "$work/$name.new/ck/$(basename "$f")" || diff+=" $(basename "$f")"
  done
  [ "$(losses "$work/$name.old/metrics.jsonl")" = "$(losses "$work/$name.new/metrics.jsonl")" ] ||
    diff+=" losses"
  if [ -n "$diff" ]; then
    echo "FAIL $name:$diff"
    failures=$((failures + 1))
  else
    local files steps
    files=$(ls "$work/$name.old/ck" | grep -c step_)
    steps=$(losses "$work/$name.old/metrics.jsonl" | wc -l)
    echo "same $name ($files files, $steps steps)"
  fi
}

small=(trainer.steps=4 data.batch_size=4 model.n_layer=2)
for config in gpt_tiny llama_tiny; do
  for precision in fp32 bf16; do
    for attention in fused materialized; do
      for recompute in none selective full; do
        run "$config-$precision-$attention-$recompute" "$config.yaml" "${small[@]}" \
          trainer.precision=$precision model.attention=$attention trainer.recompute=$recompute
      done
    done
    run "$config-$precision-accumulate" "$config.yaml" "${small[@]}" \
      trainer.precision=$precision trainer.accumulate_steps=2 trainer.recompute=full
  done
done
for precision in fp32 bf16; do
  run "sft_tiny-$precision" sft_tiny.yaml trainer.steps=4 data.batch_size=4 \
    trainer.precision=$precision
  for dropout in 0 0.1; do
    for recompute in none full; do
      run "sft_lora_tiny-$precision-dropout$dropout-$recompute" sft_lora_tiny.yaml \
        trainer.steps=4 data.batch_size=4 trainer.precision=$precision \
        model.lora.dropout=$dropout trainer.recompute=$recompute trainer.accumulate_steps=2
    done
  done
done
echo "$runs runs compared, $failures differ or failed (work: $work)"
[ "$failures" -eq 0 ]
