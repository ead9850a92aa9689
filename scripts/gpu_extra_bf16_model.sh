#!/usr/bin/env bash
# Issue 16, bf16 compute on the GPU (Note [bf16 compute] in src/model/ops.hpp), after
# scripts/gpu_check.sh built build-gpu/: configs/gpt_tiny.yaml on 2 peer replicas of GPU 0 in
# fp32 and in bf16. The bf16 run must keep its replicas identical and end within 2% of the fp32
# eval loss (on the CPU: 1.7965 fp32, 1.7988 bf16). Prints both summaries' precision, wall time,
# tokens/s and eval loss. About a minute.
#
#   bash scripts/gpu_extra_bf16_model.sh    # from the repository root
#
# Exit status: 0 when both runs finish and the bf16 one meets the bound; 1 otherwise.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD="${LOCKSTEP_GPU_BUILD:-build-gpu}"
OUT="${OUT:-./gpu-check-out}"
mkdir -p "$OUT" || exit 1
OUT="$(cd "$OUT" && pwd)"
for precision in fp32 bf16; do
  if ! timeout 240 "$BUILD/lockstep" train configs/gpt_tiny.yaml --set trainer.backend=cuda \
    --set 'trainer.devices=[0,0]' --set trainer.comm=peer --set trainer.precision=$precision \
    --set trainer.checkpoint.dir=null --summary-json "$OUT/gpu_extra_bf16_model_$precision.json" \
    > "$OUT/gpu_extra_bf16_model_$precision.log" 2>&1; then
    echo "gpu_extra_bf16_model: gpt_tiny $precision on cuda: FAILED" \
      "(see $OUT/gpu_extra_bf16_model_$precision.log)"
    exit 1
  fi
done
python3 - "$OUT/gpu_extra_bf16_model_fp32.json" "$OUT/gpu_extra_bf16_model_bf16.json" << 'PY'
import json, sys
fp32, bf16 = (json.load(open(p)) for p in sys.argv[1:3])
for s in (fp32, bf16):
    print("gpu_extra_bf16_model: gpt_tiny %s on cuda: %.1f s, %.0f tokens/s, eval loss %.4f, "
          "replicas identical %s" % (s["precision"], s["wall_s"], s["tokens_per_s"],
                                     s["eval_loss"], s["replicas_identical"]))
ok = bf16["replicas_identical"] and abs(bf16["eval_loss"] / fp32["eval_loss"] - 1) <= 0.02
print("gpu_extra_bf16_model: %s" % ("PASS" if ok else "FAIL"))
sys.exit(0 if ok else 1)
PY
