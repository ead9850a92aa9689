#!/usr/bin/env bash
# LoRA against a full fine-tune of configs/smollm2_135m.yaml's shape on the CPU (issue 44's
# goal): gradient bytes per step and optimiser state from the run's summary (the memory plan),
# and the step time side by side, N workers, a short context and batch so that it fits a small
# machine. Random tokens and a random base: the figures are of the step, not of learning.
#   bench/lora_vs_full.sh BUILD_DIR [WORKERS [CONTEXT [BATCH [STEPS [RANK [ROUNDS]]]]]]
# The step time is read from each run's trace (trainer.trace): the time from one step's forward
# to the next one's on worker 0, the first step left out, median over the steps of all rounds.
# The runs alternate, full then LoRA, ROUNDS times, so that a shared machine's load falls on both
# alike. No eval runs: the run's whole-wall tokens/s would count the start-up (the random base,
# the full fine-tune's first touch of its gradients and optimiser state) and an eval pass, the
# same forward for both, which drowned the step's difference in the first version of this bench.
set -euo pipefail
usage="usage: bench/lora_vs_full.sh BUILD_DIR [WORKERS [CONTEXT [BATCH [STEPS [RANK [ROUNDS]]]]]]"
build=${1:?$usage}
workers=${2:-2} context=${3:-64} batch=${4:-2} steps=${5:-8} rank=${6:-16} rounds=${7:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -c "
import random, array
random.seed(0)
array.array('H', (random.randrange(49152) for _ in range(200000))).tofile(open('$work/tokens.bin', 'wb'))"
common=(--set data.path="$work/tokens.bin" --set data.eval_path= --set data.eval_fraction=0
        --set model.context="$context" --set data.batch_size="$batch" --set trainer.steps="$steps"
        --set trainer.devices="$workers" --set trainer.backend=cpu --set trainer.precision=fp32
        --set trainer.checkpoint.dir= --set trainer.eval_every=0 --set trainer.log_every="$steps")
run() {  # NAME, then extra --set flags
  local name=$1; shift
  "$build/lockstep" train "$here/configs/smollm2_135m.yaml" "${common[@]}" "$@" \
    --set trainer.trace="$work/$name.trace.json" \
    --summary-json "$work/$name.json" > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
}
for round in $(seq "$rounds"); do
  run "full$round"
  run "lora$round" --set model.lora.rank="$rank" --set model.lora.alpha=$((2 * rank)) \
    --set model.lora.targets=all
done
python3 - "$work" "$workers" "$context" "$batch" "$steps" "$rank" "$rounds" <<'PY'
import json, statistics, sys
work, workers, context, batch, steps, rank, rounds = sys.argv[1:]

def worker0(name):  # worker 0's spans in a run's trace, and its steps' starts after the first
    events = json.load(open(f"{work}/{name}.trace.json"))
    events = events["traceEvents"] if isinstance(events, dict) else events
    mine = [e for e in events if e.get("ph") == "X" and e.get("tid") == 0]
    return mine, sorted(e["ts"] for e in mine if e["name"] == "forward")[1:]

def step_times(name):  # seconds from one step's forward to the next's, step 1 left out
    starts = worker0(name)[1]
    return [(b - a) / 1e6 for a, b in zip(starts, starts[1:])]

full, lora = (json.load(open(f"{work}/{n}1.json")) for n in ("full", "lora"))
times = {n: [t for r in range(1, int(rounds) + 1) for t in step_times(f"{n}{r}")]
         for n in ("full", "lora")}
median = {n: statistics.median(t) for n, t in times.items()}
print(f"SmolLM2-135M shape, fp32 CPU, {workers} workers, context {context}, batch {batch} per "
      f"worker, {steps} steps x {rounds} rounds alternating; LoRA rank {rank} on "
      f"q,k,v,o,gate,up,down")
print(f"{'':28}{'full':>16}{'LoRA':>16}{'ratio':>10}")
rows = [("trainable parameters", full["trainable_parameters"], lora["trainable_parameters"]),
        ("gradient bytes per step", full["gradient_bytes_per_step"], lora["gradient_bytes_per_step"]),
        ("optimiser state bytes", full["planned_optimizer_state_bytes"], lora["planned_optimizer_state_bytes"]),
        ("median step s", median["full"], median["lora"])]
for name, f, l in rows:
    print(f"{name:28}{f:16.6g}{l:16.6g}{f / l:10.2f}x")

def phases(name):  # worker 0's seconds in each phase per step, over the steps of step_times
    mine, starts = worker0(name)
    out = {}
    for e in mine:
        phase = "wait bucket" if e["name"].startswith("wait bucket") else e["name"]
        if phase in ("forward", "backward", "wait bucket", "optimizer") and starts[0] <= e["ts"] < starts[-1]:
            out[phase] = out.get(phase, 0.0) + e["dur"] / 1e6 / (len(starts) - 1)
    return out

for n in ("full", "lora"):
    per = [phases(f"{n}{r}") for r in range(1, int(rounds) + 1)]
    print(f"{n} median s per step in: " + ", ".join(
        f"{p} {statistics.median(r.get(p, 0.0) for r in per):.3f}"
        for p in ("forward", "backward", "wait bucket", "optimizer")))
    print(f"{n} step times (s): " + " ".join(f"{t:.3f}" for t in times[n]))
print(f"LoRA summary's full fine-tune plan: {lora['full_finetune']}")
PY
