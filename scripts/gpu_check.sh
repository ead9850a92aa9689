#!/usr/bin/env bash
# The GPU check: one command that builds lockstep with its CUDA backend (sm_90), runs the GPU
# tests, the GPU benchmark (bench/bench_gpu.cpp) and the PyTorch reference
# (bench/gpu_mlp_torch.py), and prints a short table last. See bench/GPU.md.
#
#   bash scripts/gpu_check.sh          # logs and CSVs under ${OUT:-./gpu-check-out}
#
# On the lent GPU machine (one H200; no network, none of our Debian packages; see
# shared/GPU.md):
#   1. here, once, from the project root:   bash ../shared/device/fetch-debs.sh .devdeps
#      and the cuDNN frontend's headers (the GPU machine cannot reach PyPI):
#        bash -c 'source scripts/common.sh; fetch_cudnn_frontend .devdeps/cudnn_frontend'
#   2. the device tool's run:               command "bash scripts/gpu_check.sh",
#                                           carry [".devdeps"], timeout_s 540
#   Expected to take a few minutes there, build included (not yet measured); each phase runs
#   under `timeout`, cut so that the whole stays within LOCKSTEP_GPU_BUDGET_S (450 s). Then give
#   the machine back.
#
# What it does:
#   - .devdeps/*.deb present: unpacks them into /tmp/p and configures against that prefix
#     (shared/GPU.md's flags); absent: uses the system's packages;
#   - finds NCCL (the CUDA toolkit's, $NCCL_HOME, pip's nvidia-nccl package, or a search) and,
#     when the toolkit lacks it, cuBLAS the same way; cuDNN too (the toolkit's, $CUDNN_ROOT,
#     PyTorch's nvidia-cudnn package, or a search), with the cuDNN frontend's headers from
#     .devdeps/cudnn_frontend, for the fused attention (issue 32);
#   - configures build-gpu/ (Ninja when available, Release, CMAKE_CUDA_ARCHITECTURES=90) and
#     builds with every core;
#   - runs `lockstep_tests -ts='cuda*'` and reports passed / failed / skipped;
#   - with a usable GPU: bench_attention --backend cuda (B 8, H 12, D 64, T 1024, bf16: cuDNN's
#     fused attention and the materialised path, forward + backward, TFLOP/s with causal FLOPs
#     counted as half) and GPT-2 124M's bf16 step with model.attention fused and materialized
#     (issue 32; not yet measured on a GPU);
#   - with a usable GPU: bench_gpu (TF32 off/on, peer replicas N = 1, 2, 4); the GPT parity test
#     on the GPU (lockstep's CUDA GPT against PyTorch's, fp32) and bench/compare_gpt.py (GPT-2
#     124M step time against PyTorch eager, TF32, with MFU); the same in bf16 (issue 16:
#     bench/compare_gpt.py --precision bf16, lockstep trainer.precision fp32 and bf16 against
#     PyTorch fp32, autocast bf16 and PyTorch at its best (issue 25: + scaled_dot_product_attention,
#     fused AdamW, torch.compile), step time and MFU against the GPU's dense bf16 peak; and
#     scripts/gpu_extra_bf16_model.sh, gpt_tiny in fp32 and bf16 on 2 peer replicas, within 2%;
#     scripts/gpu_extra_linear.sh, GPT-2 124M with the linear layers through cuBLASLt's fused
#     epilogues against plain kernels, with each run's fused/partly/composed product counts
#     (failing when a fused run had a refusal) and the bf16 step with the fused classifier
#     (issue 25); not yet measured on a GPU); a gpt_tiny run on 4 peer replicas
#     of GPU 0 for the host syncs per step (`host_syncs_per_step` of --summary-json, "n/a" when
#     the build does not report it) and the share of communication hidden; the same 4 replicas
#     losing one at step 20 with trainer.on_worker_failure shrink (issue 28: exit 0, one worker
#     lost, step 20 done again within 10 s of step 19's end); GPT-2 124M bf16 taking an
#     asynchronous in-memory snapshot every 5 steps, the cost per snapshot against the steps
#     without (issue 28, bench/snapshot_cost.py); bench_kernels (the
#     kernels of issue 17 at GPT-2 124M's shapes, the LM head with and without the padded
#     vocabulary); two fault cases on 4 peer replicas (LOCKSTEP_FAULT forward, and stall with
#     trainer.step_timeout_s 2), each of which must exit 1 within 10 s; two processes making one
#     2-rank NCCL communicator on GPU 0 (issue 31, two_process_phase below); the PyTorch MLP
#     reference; then the table: lockstep and PyTorch samples/s and their ratio, the GPT
#     figures, the step figures, the fault cases and the kernels;
#   - without one: says so plainly ("no usable GPU: <reason>") and exits 0 once the build and the
#     (skipping) tests are done.
#
# The benchmark phases run in priority order (GPU_PHASES_DEFAULT below: this wave's new work
# first), each only while 45 s of the budget are left; the table lists those not run.
#
# Environment: LOCKSTEP_GPU_PHASES (the phases to run, in order, space-separated, e.g.
# "gpt_bf16 attention"; default GPU_PHASES_DEFAULT), OUT (log folder), LOCKSTEP_GPU_BUILD
# (build folder, default build-gpu), CUDNN_ROOT,
# LOCKSTEP_GPU_BUDGET_S (time budget, default 450), LOCKSTEP_GPU_BUILD_S (the build's own limit,
# default 300; raise both on a small machine), LOCKSTEP_DEPS_PREFIX (default /tmp/p),
# LOCKSTEP_CMAKE_ARGS (extra configure arguments, split on spaces), NCCL_HOME, BENCH_ARGS and
# TORCH_ARGS (extra arguments of bench_gpu and gpu_mlp_torch.py, e.g. "--runs 5").
#
# Exit status: 0 when the build succeeded, every GPU test passed or skipped, and (with a GPU)
# both benchmarks ran; 1 otherwise.
set -uo pipefail

OUT="${OUT:-./gpu-check-out}"
if ! mkdir -p "$OUT"; then
  echo "gpu_check: cannot create $OUT" >&2
  exit 1
fi
OUT="$(cd "$OUT" && pwd)"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
BUILD="${LOCKSTEP_GPU_BUILD:-$ROOT/build-gpu}"
PREFIX="${LOCKSTEP_DEPS_PREFIX:-/tmp/p}"
BUDGET="${LOCKSTEP_GPU_BUDGET_S:-450}"
START=$(date +%s)
LOG="$OUT/gpu_check.log"
: > "$LOG"

say() { echo "gpu_check: $*" | tee -a "$LOG"; }
# Seconds the next phase may take: WANTED, cut to what the budget has left (keeping 15 s for the
# table), and never below 10.
limit() {
  local left=$((START + BUDGET - $(date +%s) - 15))
  ((left < 10)) && left=10
  if (($1 < left)); then echo "$1"; else echo "$left"; fi
}
# run_phase NAME WANTED_SECONDS LOGFILE CMD...: runs CMD under timeout, output to LOGFILE.
# Returns CMD's status (124 or 137 when it ran out of time).
run_phase() {
  local name=$1 wanted=$2 logfile=$3
  shift 3
  local t0 secs status
  secs=$(limit "$wanted")
  t0=$(date +%s)
  say "$name: running (at most ${secs} s; log $logfile)"
  timeout -k 10 "$secs" "$@" > "$logfile" 2>&1
  status=$?
  if ((status == 124 || status == 137)); then
    say "$name: TIMED OUT after $(($(date +%s) - t0)) s"
  else
    say "$name: exit $status after $(($(date +%s) - t0)) s"
  fi
  return "$status"
}

# exits_1_within_10s LOGFILE CMD...: runs a fault case, output to $OUT/LOGFILE; prints "exit 1 in
# S s", or "FAILED (...)" and returns 1 when CMD did not exit 1 within 10 s.
exits_1_within_10s() {
  local logfile=$1 t0 status secs
  shift
  t0=$(date +%s.%N)
  "$@" > "$OUT/$logfile" 2>&1
  status=$?
  secs=$(python3 -c "import sys; print('%.1f' % (float(sys.argv[2]) - float(sys.argv[1])))" \
    "$t0" "$(date +%s.%N)")
  if ((status == 1)) && python3 -c "import sys; sys.exit(float(sys.argv[1]) > 10)" "$secs"; then
    echo "exit 1 in $secs s"
  else
    echo "FAILED (exit $status in $secs s, see $logfile)"
    return 1
  fi
}

# Results for the table.
BUILD_RESULT="not run"
TESTS_RESULT="not run"
GPU_LINE=""
NO_GPU_REASON=""
BENCH_RESULT="not run"
TORCH_RESULT="not run"
GPT_PARITY_RESULT="not run"
GPT_BENCH_RESULT="not run"
GPT_BF16_RESULT="not run"
BF16_MODEL_RESULT="not run"
MICROBATCH_RESULT="not run"
GRAPHS_RESULT="not run"
MLP_BREAKDOWN_RESULT="not run"
LINEAR_RESULT="not run"
STEP_RESULT="not run"
ATTENTION_RESULT="not run"
SHRINK_RESULT="not run"
SNAPSHOT_RESULT="not run"
KERNELS_RESULT="not run"
FAULT_RESULT=" not run"
FAILED=0

# ---- Environment --------------------------------------------------------------------------------
{
  echo "date: $(date -u +%FT%TZ)  host: $(uname -srm)  cores: $(nproc)"
  command -v nvidia-smi > /dev/null && timeout 30 nvidia-smi
  if command -v nvcc > /dev/null; then nvcc --version | tail -2; else
    [ -x /usr/local/cuda/bin/nvcc ] && /usr/local/cuda/bin/nvcc --version | tail -2
  fi
  cmake --version | head -1
  command -v ninja > /dev/null && echo "ninja $(ninja --version)"
  command -v python3 > /dev/null && python3 --version
} > "$OUT/env.log" 2>&1
if command -v nvidia-smi > /dev/null; then
  say "nvidia-smi: $(timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total \
    --format=csv,noheader 2>&1 | head -4 | tr '\n' ';')"
else
  say "nvidia-smi: not found"
fi

# ---- Dependencies -------------------------------------------------------------------------------
CMAKE_ARGS=()
if compgen -G ".devdeps/*.deb" > /dev/null; then
  debs=(.devdeps/*.deb)
  say "unpacking ${#debs[@]} .deb files from .devdeps into $PREFIX"
  mkdir -p "$PREFIX"
  for f in "${debs[@]}"; do
    dpkg -x "$f" "$PREFIX" || { say "dpkg -x $f failed"; FAILED=1; }
  done
  # shared/GPU.md's relocated-prefix flags.
  lib="$PREFIX/usr/lib/x86_64-linux-gnu"
  inc="$PREFIX/usr/include"
  CMAKE_ARGS+=(
    "-DCMAKE_PREFIX_PATH=$PREFIX/usr"
    "-DCMAKE_LIBRARY_PATH=$lib/openblas-pthread;$lib"
    "-DCMAKE_INCLUDE_PATH=$inc/x86_64-linux-gnu/openblas-pthread;$inc")
  export LD_LIBRARY_PATH="$lib:$lib/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  say "no .devdeps/*.deb: using the system's packages"
fi

# nvcc: on PATH, or the toolkit's usual place.
if ! command -v nvcc > /dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
CUDA_ROOT=""
if command -v nvcc > /dev/null; then
  CUDA_ROOT="$(cd "$(dirname "$(command -v nvcc)")/.." && pwd)"
  CMAKE_ARGS+=("-DCMAKE_CUDA_COMPILER=$(command -v nvcc)")
  say "nvcc: $(command -v nvcc) ($(nvcc --version | grep -o 'release [0-9.]*'))"
else
  say "nvcc: not found; lockstep builds without its CUDA backend"
fi

# The folder of a Python package (namespace packages included), or nothing.
pip_dir() {
  timeout "$(limit 60)" python3 -c 'import importlib, sys
m = importlib.import_module(sys.argv[1])
print(list(m.__path__)[0])' "$1" 2> /dev/null
}
# The first file named $1 anywhere on the machine (slow: a last resort).
find_file() {
  timeout "$(limit 60)" find / \( -path /proc -o -path /sys -o -path /dev -o -path "$ROOT" \) \
    -prune -o -name "$1" -print 2> /dev/null | head -1
}
# in_toolkit FILE...: true when one of the patterns exists under the toolkit or the system paths.
in_toolkit() {
  local d f
  for d in "$CUDA_ROOT/include" "$CUDA_ROOT/lib64" "$CUDA_ROOT/lib" \
    "$CUDA_ROOT/targets/x86_64-linux/include" "$CUDA_ROOT/targets/x86_64-linux/lib" \
    /usr/include /usr/lib/x86_64-linux-gnu; do
    for f in "$@"; do compgen -G "$d/$f" > /dev/null && return 0; done
  done
  return 1
}
add_library_path() { export LD_LIBRARY_PATH="$1${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; }

# find_dependency NAME HOME_VAR PIP_MODULE HEADER LIBRARY CMAKE_PREFIX MISSING: a library the
# configure finds through $HOME_VAR, then the toolkit or the system; else a pip package's
# PIP_MODULE folder (include/HEADER, lib/), which sets HOME_VAR; else a search of the disk, which
# passes CMAKE_PREFIX_INCLUDE_DIR and CMAKE_PREFIX_LIBRARY to the configure. MISSING ends the
# line that says it is nowhere.
find_dependency() {
  local name=$1 var=$2 module=$3 header=$4 library=$5 prefix=$6 missing=$7 dir found_h found_l
  if [ -n "${!var:-}" ]; then
    say "$name: $var=${!var}"
    add_library_path "${!var}/lib"
  elif in_toolkit "$header" && in_toolkit "$library"; then
    say "$name: the CUDA toolkit's or the system's"
  elif dir=$(pip_dir "$module") && [ -n "$dir" ] && [ -f "$dir/include/$header" ]; then
    export "$var=$dir"
    add_library_path "$dir/lib"
    say "$name: pip package, $var=$dir"
  else
    found_h=$(find_file "$header")
    found_l=$(find_file "$library")
    if [ -n "$found_h" ] && [ -n "$found_l" ]; then
      CMAKE_ARGS+=("-D${prefix}_INCLUDE_DIR=$(dirname "$found_h")" "-D${prefix}_LIBRARY=$found_l")
      add_library_path "$(dirname "$found_l")"
      say "$name: found $found_h and $found_l"
    else
      say "$name: not found (set $var); $missing"
    fi
  fi
}

if [ -n "$CUDA_ROOT" ]; then
  find_dependency NCCL NCCL_HOME nvidia.nccl nccl.h 'libnccl.so*' NCCL \
    "the configure step will say so"
  # cuDNN, for the fused attention (FindCudnnFrontend looks in $CUDNN_ROOT, then the toolkit).
  # Its frontend (headers only) comes from .devdeps/cudnn_frontend, carried here.
  find_dependency cuDNN CUDNN_ROOT nvidia.cudnn cudnn.h 'libcudnn.so*' CUDNN \
    "lockstep builds without fused attention on cuda"
  if [ -f .devdeps/cudnn_frontend/include/cudnn_frontend.h ]; then
    CMAKE_ARGS+=("-DCUDNN_FRONTEND_ROOT=$ROOT/.devdeps/cudnn_frontend")
    say "cuDNN frontend: .devdeps/cudnn_frontend" \
      "($(cat .devdeps/cudnn_frontend/version 2> /dev/null))"
  else
    say "cuDNN frontend: no .devdeps/cudnn_frontend (see step 1 above); no fused attention on cuda"
  fi
  # cuBLAS: normally part of the toolkit; else a search of the disk (which finds pip's
  # nvidia-cublas package too).
  if ! in_toolkit cublas_v2.h || ! in_toolkit 'libcublas.so*'; then
    header=$(find_file cublas_v2.h)
    library=$(find_file 'libcublas.so*')
    library_lt=$(find_file 'libcublasLt.so*')
    if [ -n "$header" ] && [ -n "$library" ] && [ -n "$library_lt" ]; then
      CMAKE_ARGS+=("-DCUDA_cublas_LIBRARY=$library" "-DCUDA_cublasLt_LIBRARY=$library_lt"
        "-DCMAKE_CXX_FLAGS=-isystem $(dirname "$header")"
        "-DCMAKE_CUDA_FLAGS=-isystem $(dirname "$header")")
      add_library_path "$(dirname "$library")"
      say "cuBLAS: not in the toolkit; using $library"
    else
      say "cuBLAS: not found; the configure step will say so"
    fi
  fi
fi

# ---- Configure and build ------------------------------------------------------------------------
GENERATOR=()
command -v ninja > /dev/null && GENERATOR=(-G Ninja)
# A build folder made for another source tree or generator cannot be reused.
if [ -f "$BUILD/CMakeCache.txt" ]; then
  want_gen="Unix Makefiles"
  ((${#GENERATOR[@]})) && want_gen="Ninja"
  if ! grep -qx "CMAKE_HOME_DIRECTORY:INTERNAL=$ROOT" "$BUILD/CMakeCache.txt" ||
    ! grep -qx "CMAKE_GENERATOR:INTERNAL=$want_gen" "$BUILD/CMakeCache.txt"; then
    say "removing $BUILD (made for another tree or generator)"
    rm -rf "$BUILD"
  fi
fi
read -r -a EXTRA_ARGS <<< "${LOCKSTEP_CMAKE_ARGS:-}"
build_start=$(date +%s)
if run_phase configure 120 "$OUT/configure.log" \
  cmake -S "$ROOT" -B "$BUILD" "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DLOCKSTEP_BUILD_TESTS=ON -DLOCKSTEP_BUILD_BENCH=ON \
  "${CMAKE_ARGS[@]}" "${EXTRA_ARGS[@]}" &&
  run_phase build "${LOCKSTEP_GPU_BUILD_S:-300}" "$OUT/build.log" \
    cmake --build "$BUILD" -j "$(nproc)"; then
  BUILD_RESULT="ok ($(($(date +%s) - build_start)) s, $(nproc) cores)"
  grep -E '^-- lockstep: (CUDA backend|cuDNN)' "$OUT/configure.log" | sed 's/^-- /gpu_check: /' |
    tee -a "$LOG"
else
  BUILD_RESULT="FAILED (see configure.log / build.log)"
  FAILED=1
  tail -n 25 "$OUT/build.log" "$OUT/configure.log" 2> /dev/null | tail -n 40
fi

# ---- Two NCCL ranks on one GPU (issue 31) -------------------------------------------------------
# Two processes (tests/two_process/two_process_run.cpp), each with devices [0] and its own
# NCCL_HOSTID, make one 2-rank NCCL communicator over NCCL's socket transport: gpt_tiny for 20
# steps with zero 0, zero 1 and bf16 gradient reduction. With zero 0 and 1 the parameter hash
# must equal that of 2 peer replicas of GPU 0 in one process: with 2 ranks every element's sum
# is the single addition a0 + a1, and the average a multiplication by 1/2, exact, in both
# communicators (with more ranks NCCL's order of additions may differ from the peer group's
# rank order, and the bits with it). bf16 (the peer group refuses it) must end with identical
# replicas. LOCKSTEP_FAULT forward on rank 1 must end both processes with exit 1 within 10 s.
# Sets TWO_PROCESS_RESULT.
TWO_PROCESS_RESULT="not run"
two_process_phase() {
  local launcher="$BUILD/tests/lockstep_two_process_run" name status hash peer_hash
  if [ ! -x "$launcher" ]; then
    TWO_PROCESS_RESULT="FAILED (no $launcher)"
    FAILED=1
    return
  fi
  local common=(configs/gpt_tiny.yaml --set trainer.backend=cuda --set trainer.steps=20
    --set trainer.checkpoint.dir=null --set trainer.log_every=10)
  local nccl_env=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo
    NCCL_DEBUG=WARN)
  TWO_PROCESS_RESULT=""
  for name in zero0 zero1 bf16; do
    local extra=(--set trainer.zero=0)
    [ "$name" = zero1 ] && extra=(--set trainer.zero=1)
    [ "$name" = bf16 ] && extra=(--set trainer.grad_reduce_dtype=bf16)
    env "${nccl_env[@]}" timeout -k 5 "$(limit 90)" "$launcher" "${common[@]}" "${extra[@]}" \
      --set 'trainer.devices=[0]' --set trainer.comm=nccl \
      --summary-json "$OUT/two_process_$name.json" > "$OUT/two_process_$name.log" 2>&1
    status=$?
    hash=$(grep -o '"param_hash": "[0-9a-f]*"' "$OUT/two_process_$name.json" 2> /dev/null)
    if ((status != 0)); then
      TWO_PROCESS_RESULT="$TWO_PROCESS_RESULT $name: FAILED (exit $status, see two_process_$name.log);"
      FAILED=1
      continue
    fi
    if [ "$name" = bf16 ]; then
      TWO_PROCESS_RESULT="$TWO_PROCESS_RESULT $name: ok (replicas identical);"
      continue
    fi
    timeout -k 5 "$(limit 90)" "$BUILD/lockstep" train "${common[@]}" "${extra[@]}" \
      --set 'trainer.devices=[0,0]' --set trainer.comm=peer \
      --summary-json "$OUT/peer_$name.json" > "$OUT/peer_$name.log" 2>&1
    peer_hash=$(grep -o '"param_hash": "[0-9a-f]*"' "$OUT/peer_$name.json" 2> /dev/null)
    if [ -n "$hash" ] && [ "$hash" = "$peer_hash" ]; then
      TWO_PROCESS_RESULT="$TWO_PROCESS_RESULT $name: ok (= 2 peer replicas);"
    else
      TWO_PROCESS_RESULT="$TWO_PROCESS_RESULT $name: FAILED (${hash:-no hash} vs peer ${peer_hash:-no hash});"
      FAILED=1
    fi
  done
  local fault
  fault=$(exits_1_within_10s two_process_fault.log env "${nccl_env[@]}" \
    LOCKSTEP_FAULT=1:5:forward timeout -k 5 30 "$launcher" "${common[@]}" \
    --set 'trainer.devices=[0]' --set trainer.comm=nccl) || FAILED=1
  TWO_PROCESS_RESULT="$TWO_PROCESS_RESULT fault: $fault"
  say "two NCCL ranks on one GPU:$TWO_PROCESS_RESULT"
}

# ---- GPU tests ----------------------------------------------------------------------------------
build_ok=0
[ "${BUILD_RESULT:0:2}" = ok ] && build_ok=1
have_cuda_build=0
((build_ok)) && [ -x "$BUILD/bench/bench_gpu" ] && have_cuda_build=1
if ((build_ok)); then
  run_phase tests 150 "$OUT/tests.log" "$BUILD/tests/lockstep_tests" -ts='cuda*'
  status=$?
  # "[doctest] test cases: 16 | 16 passed | 0 failed | 113 skipped" (skipped: filtered out). A
  # GPU test that cannot run says "MESSAGE: skipping: ..." and passes: count those as skipped.
  line=$(grep -E '^\[doctest\] test cases:' "$OUT/tests.log" | tail -1)
  if [ -n "$line" ]; then
    ran=$(sed -E 's/.*test cases: *([0-9]+).*/\1/' <<< "$line")
    passed=$(sed -E 's/.*\| *([0-9]+) passed.*/\1/' <<< "$line")
    failed=$(sed -E 's/.*\| *([0-9]+) failed.*/\1/' <<< "$line")
    skipped=$(grep -c 'MESSAGE: skipping' "$OUT/tests.log")
    TESTS_RESULT="$((passed - skipped)) passed, $failed failed, $skipped skipped (of $ran)"
  else
    TESTS_RESULT="no doctest summary"
  fi
  if ((status != 0)); then
    TESTS_RESULT="FAILED (exit $status): $TESTS_RESULT"
    FAILED=1
    grep -E 'ERROR|FATAL|TEST CASE|test_cuda.cpp' "$OUT/tests.log" | head -30
  fi
  say "GPU tests: $TESTS_RESULT"
fi

# ---- Is there a GPU? ----------------------------------------------------------------------------
if ((have_cuda_build)); then
  probe=$(timeout 60 "$BUILD/bench/bench_gpu" --probe 2>&1)
  if grep -q '^gpu: ' <<< "$probe"; then
    GPU_LINE=${probe#gpu: }
    say "GPU: $GPU_LINE"
  else
    NO_GPU_REASON=$(sed -n 's/^no usable GPU: //p' <<< "$probe" | head -1)
    [ -z "$NO_GPU_REASON" ] && NO_GPU_REASON="bench_gpu --probe said: $(head -c 300 <<< "$probe")"
  fi
elif ((build_ok)); then
  NO_GPU_REASON="this build has no CUDA backend (no nvcc?); see configure.log"
  if command -v nvidia-smi > /dev/null && timeout 30 nvidia-smi -L 2> /dev/null | grep -q GPU; then
    FAILED=1  # a GPU is there and we could not build for it
  fi
else
  NO_GPU_REASON="the build failed"
fi
if [ -n "$NO_GPU_REASON" ]; then
  say "no usable GPU: $NO_GPU_REASON"
  say "no usable GPU is present: the GPU tests skipped and the benchmarks are not run"
  BENCH_RESULT="skipped (no usable GPU)"
  TORCH_RESULT="skipped (no usable GPU)"
fi

# ---- Benchmarks ---------------------------------------------------------------------------------
# One function per phase (phase_NAME), run by the loop below in the order of LOCKSTEP_GPU_PHASES.
phase_bench_gpu() {
  read -r -a bench_args <<< "${BENCH_ARGS:-}"
  if run_phase bench_gpu 180 "$OUT/bench_gpu.log" \
    "$BUILD/bench/bench_gpu" --csv "$OUT/bench_gpu.csv" "${bench_args[@]}" &&
    [ -s "$OUT/bench_gpu.csv" ]; then
    BENCH_RESULT="ok"
  else
    BENCH_RESULT="FAILED (see bench_gpu.log)"
    FAILED=1
  fi
  cat "$OUT/bench_gpu.log"
}
phase_gpt_parity() {
  # GPT (issue: language models): lockstep's fp32 GPT against PyTorch on the GPU, then GPT-2
  # 124M step time against PyTorch eager (TF32 on both), with lockstep's MFU.
  if run_phase gpt_parity 90 "$OUT/gpt_parity.log" env LOCKSTEP_PARITY_BACKEND=cuda \
    LOCKSTEP_PYTHON=python3 "$BUILD/tests/lockstep_tests" -tc='gpt parity*' -s; then
    GPT_PARITY_RESULT="ok ($(grep -m1 'worst loss' "$OUT/gpt_parity.log"))"
  else
    GPT_PARITY_RESULT="FAILED (see gpt_parity.log)"
    FAILED=1
  fi
}
phase_gpt_bench() {
  if run_phase gpt_bench 150 "$OUT/gpt_bench.log" python3 "$ROOT/bench/compare_gpt.py" \
    --device cuda --preset 124m --batch 8 --tf32 --pairs 3 --steps 10 --build "$BUILD" \
    --csv "$OUT/gpt_bench.csv"; then
    GPT_BENCH_RESULT="ok"
  else
    GPT_BENCH_RESULT="FAILED (see gpt_bench.log)"
    FAILED=1
  fi
  cat "$OUT/gpt_bench.log"
}
phase_gpt_bf16() {
  # Issue 16: GPT-2 124M in bf16, lockstep (trainer.precision) against PyTorch autocast, MFU
  # against the GPU's dense bf16 peak (also in lockstep's table, src/train/peak_flops.cpp; the
  # script computes PyTorch's MFU from it).
  case "$GPU_LINE" in
    *"H100 PCIe"*) bf16_peak=(--peak-tflops 756) ;;
    *H100* | *H200*) bf16_peak=(--peak-tflops 989.4) ;;
    *A100*) bf16_peak=(--peak-tflops 312) ;;
    *) bf16_peak=() ;;
  esac
  # Issue 25: and PyTorch at its best beside them (--torch-best: autocast bf16,
  # scaled_dot_product_attention, fused AdamW, torch.compile; its compile time is printed and
  # excluded), with lockstep bf16 / best PyTorch.
  if run_phase gpt_bf16 240 "$OUT/gpt_bf16.log" python3 "$ROOT/bench/compare_gpt.py" \
    --device cuda --preset 124m --batch 8 --precision bf16 "${bf16_peak[@]}" --pairs 2 \
    --steps 10 --torch-best --build "$BUILD" --csv "$OUT/gpt_bf16.csv"; then
    GPT_BF16_RESULT="ok"
  else
    GPT_BF16_RESULT="FAILED (see gpt_bf16.log)"
    FAILED=1
  fi
  cat "$OUT/gpt_bf16.log"
}
phase_graphs() {
  # Issue 25 item 6: GPT-2 124M's bf16 step with trainer.cuda_graphs off and on, alternately,
  # and one run of auto long enough to time both ways (Note [Step graphs]).
  if run_phase graphs 150 "$OUT/graphs.log" python3 "$ROOT/bench/graph_step.py" \
    --device cuda --preset 124m --batch 8 --precision bf16 --pairs 2 --steps 12 --auto \
    --build "$BUILD"; then
    GRAPHS_RESULT=$(grep -m1 '^graph_step: speedup' "$OUT/graphs.log" | sed 's/^graph_step: //')
  else
    GRAPHS_RESULT="FAILED (see graphs.log)"
    FAILED=1
  fi
  cat "$OUT/graphs.log"
}
phase_microbatch() {
  # Issue 25 item 9: the micro-batch that trains GPT-2 124M fastest in bf16 on this GPU (for
  # configs/gpt2_124m.yaml's data.batch_size; llm.c uses 64 x 1024).
  if run_phase microbatch 120 "$OUT/microbatch.log" python3 "$ROOT/bench/sweep_gpt_batch.py" \
    --device cuda --preset 124m --precision bf16 --batches 8,16,32,64 --steps 6 \
    --build "$BUILD" --csv "$OUT/microbatch.csv"; then
    MICROBATCH_RESULT=$(grep -m1 '^fastest:' "$OUT/microbatch.log")
  else
    MICROBATCH_RESULT="FAILED (see microbatch.log)"
    FAILED=1
  fi
  cat "$OUT/microbatch.log"
}
phase_bf16_model() {
  # Issue 16: bf16 compute trains on the GPU as on the CPU: gpt_tiny on 2 peer replicas in fp32
  # and bf16, replicas identical and the bf16 eval loss within 2% of fp32's.
  if run_phase bf16_model 150 "$OUT/bf16_model.log" env LOCKSTEP_GPU_BUILD="$BUILD" OUT="$OUT" \
    bash "$ROOT/scripts/gpu_extra_bf16_model.sh"; then
    BF16_MODEL_RESULT="ok"
  else
    BF16_MODEL_RESULT="FAILED (see bf16_model.log)"
    FAILED=1
  fi
  cat "$OUT/bf16_model.log"
}
phase_linear() {
  # Issue 16: the linear layers through cuBLASLt's fused epilogues against plain kernels
  # (LOCKSTEP_CUDA_LINEAR=fused, bias, composed), GPT-2 124M in tf32 and bf16: step times,
  # losses within 1%.
  if run_phase linear 180 "$OUT/linear.log" env LOCKSTEP_GPU_BUILD="$BUILD" \
    bash "$ROOT/scripts/gpu_extra_linear.sh"; then
    LINEAR_RESULT="ok"
  else
    LINEAR_RESULT="FAILED (see linear.log)"
    FAILED=1
  fi
  cat "$OUT/linear.log"
}
phase_mlp_breakdown() {
  # Issue 25 item 8: the MLP 1024-4096-4096-1024 step (TF32 off) op by op, lockstep's Device
  # ops against the ops PyTorch's autograd and SGD run, to find where the step's gap lies.
  if run_phase mlp_breakdown 90 "$OUT/mlp_breakdown.log" python3 "$ROOT/bench/mlp_breakdown.py" \
    --build "$BUILD" --pairs 3; then
    MLP_BREAKDOWN_RESULT=$(grep -m1 '^mlp_breakdown: sum' "$OUT/mlp_breakdown.log" |
      sed 's/^mlp_breakdown: //')
  else
    MLP_BREAKDOWN_RESULT="FAILED (see mlp_breakdown.log)"
    FAILED=1
  fi
  cat "$OUT/mlp_breakdown.log"
}
phase_attention() {
  # Issue 32: cuDNN's fused attention against the materialised path, alone and in GPT-2 124M's
  # bf16 step.
  if run_phase attention 120 "$OUT/attention.log" env LOCKSTEP_GPU_BUILD="$BUILD" \
    bash "$ROOT/scripts/gpu_extra_attention.sh"; then
    ATTENTION_RESULT="ok"
  else
    ATTENTION_RESULT="FAILED (see attention.log)"
    FAILED=1
  fi
  cat "$OUT/attention.log"
}
phase_gpu_step() {
  # Issue 17: one short GPT run with 4 peer replicas on GPU 0 for the host syncs per step and
  # the share of communication hidden (from --summary-json), the changed kernels, and the two
  # fault cases, each of which must exit 1 within 10 s.
  if run_phase gpu_step 60 "$OUT/gpu_step.log" "$BUILD/lockstep" train configs/gpt_tiny.yaml \
    --set trainer.backend=cuda --set 'trainer.devices=[0,0,0,0]' --set trainer.comm=peer \
    --set trainer.overlap=true --set trainer.steps=40 --set trainer.eval_every=0 \
    --set trainer.checkpoint.dir="$OUT/gpu_step_ckpt" --summary-json "$OUT/gpu_step.json"; then
    STEP_RESULT=$(python3 - "$OUT/gpu_step.json" << 'PY'
import json, sys
s = json.load(open(sys.argv[1]))
syncs = s.get("host_syncs_per_step")
hidden = s.get("comm_hidden_fraction")
busy = s.get("device_busy")
print("host syncs per step %s, communication hidden %s, device busy %s, %.1f ms of wall time "
      "per step (4 peer replicas, gpt_tiny)" % ("n/a" if syncs is None else "%g" % syncs,
                     "n/a" if hidden is None else "%.0f%%" % (100 * hidden),
                     "n/a" if busy is None else "%.0f%%" % (100 * busy),
                     1e3 * s["wall_s"] / max(1, s["steps"])))
PY
    )
  else
    STEP_RESULT="FAILED (see gpu_step.log)"
    FAILED=1
  fi
  say "GPU step: $STEP_RESULT"
}
phase_shrink() {
  # Issue 28: 4 peer replicas of gpt_tiny lose replica 2 at step 20 (trainer.on_worker_failure
  # shrink): exit 0, one worker lost, and step 20 done again within 10 s of the step before it.
  if run_phase shrink 60 "$OUT/shrink.log" env LOCKSTEP_FAULT=2:20:lost "$BUILD/lockstep" train \
    configs/gpt_tiny.yaml --set trainer.backend=cuda --set 'trainer.devices=[0,0,0,0]' \
    --set trainer.comm=peer --set trainer.steps=30 --set trainer.eval_every=0 \
    --set trainer.log_every=1 --set trainer.checkpoint.dir=null \
    --set trainer.on_worker_failure=shrink --set trainer.metrics="$OUT/shrink.jsonl" \
    --summary-json "$OUT/shrink.json"; then
    SHRINK_RESULT=$(python3 - "$OUT/shrink.json" "$OUT/shrink.jsonl" << 'PY'
import json, sys
s = json.load(open(sys.argv[1]))
steps = {}
for line in open(sys.argv[2]):
    d = json.loads(line)
    if d.get("kind") == "step": steps[d["step"]] = d["elapsed_s"]
bound = steps[20] - steps[19]
ok = s["workers_lost"] == 1 and bound <= 10
print("%s: workers_lost %d, recovery_s %.2f, step 19's end to step 20's %.2f s (goal <= 10)"
      % ("ok" if ok else "FAILED", s["workers_lost"], s["recovery_s"], bound))
PY
    )
  else
    SHRINK_RESULT="FAILED (see shrink.log)"
  fi
  [ "${SHRINK_RESULT:0:2}" = ok ] || FAILED=1
  say "GPU shrink: $SHRINK_RESULT"
}
phase_snapshot() {
  # Issue 28: what an asynchronous snapshot (pinned memory, its own stream; Note [Snapshots])
  # costs GPT-2 124M's bf16 step on one GPU, at one snapshot every 50 steps (goal <= 2%).
  if run_phase snapshot 90 "$OUT/snapshot.log" python3 "$ROOT/bench/snapshot_cost.py" \
    --build "$BUILD" --device cuda --preset 124m --batch 8 --precision bf16 --every 5 \
    --snapshots 6 --warmup 5; then
    SNAPSHOT_RESULT=$(grep -m1 '^snapshot_cost:' "$OUT/snapshot.log" | sed 's/^snapshot_cost: //')
  else
    SNAPSHOT_RESULT="FAILED (see snapshot.log)"
    FAILED=1
  fi
  say "GPU snapshot: $SNAPSHOT_RESULT"
}
phase_kernels() {
  if run_phase kernels 60 "$OUT/kernels.log" "$BUILD/bench/bench_kernels" --tf32; then
    KERNELS_RESULT="ok"
  else
    KERNELS_RESULT="FAILED (see kernels.log)"
    FAILED=1
  fi
  cat "$OUT/kernels.log"
}
phase_faults() {
  # fault_case NAME FAULT [--set ...]: the quickstart MLP on 4 peer replicas of GPU 0 with
  # LOCKSTEP_FAULT=FAULT must exit 1 within 10 s. Sets FAULT_RESULT.
  fault_case() {
    local name=$1 fault=$2 result
    shift 2
    result=$(exits_1_within_10s "fault_$name.log" env LOCKSTEP_FAULT="$fault" timeout -k 5 30 \
      "$BUILD/lockstep" train configs/quickstart.yaml --set trainer.backend=cuda \
      --set 'trainer.devices=[0,0,0,0]' --set trainer.comm=peer --set trainer.steps=1000 "$@") ||
      FAILED=1
    FAULT_RESULT="$FAULT_RESULT $name: $result;"
  }
  FAULT_RESULT=""
  fault_case forward 2:5:forward
  fault_case stall 1:5:stall --set trainer.step_timeout_s=2
  say "fault cases:$FAULT_RESULT"
}
phase_two_process() {
  two_process_phase
}
phase_torch() {
  read -r -a torch_args <<< "${TORCH_ARGS:-}"
  if run_phase torch 150 "$OUT/torch.log" \
    python3 "$ROOT/bench/gpu_mlp_torch.py" --csv "$OUT/torch.csv" "${torch_args[@]}" &&
    [ -s "$OUT/torch.csv" ]; then
    TORCH_RESULT="ok"
  elif grep -q '^no usable GPU' "$OUT/torch.log"; then
    TORCH_RESULT="skipped: $(grep -m1 '^no usable GPU' "$OUT/torch.log")"
    FAILED=1  # lockstep saw the GPU, so PyTorch should have
  else
    TORCH_RESULT="FAILED (see torch.log)"
    FAILED=1
  fi
  cat "$OUT/torch.log"
}

# The order is what the current wave most needs measured first (issue 25's bf16 step against
# PyTorch at its best, with CUDA graphs, the MLP step op by op and the micro-batch sweep; issue
# 32's attention, the fused linear layers, the step's host syncs and
# device busy share, issue 28's shrink and snapshots, the fault cases, issue 31's two NCCL ranks), then what
# earlier runs measured already (bench/GPU.md). A phase starts only with 45 s or more of the
# budget left; the others are listed as not run.
GPU_PHASES_DEFAULT="gpt_bf16 graphs mlp_breakdown microbatch attention linear gpu_step shrink \
snapshot faults two_process bf16_model gpt_parity kernels gpt_bench bench_gpu torch"
PHASES_NOT_RUN=""
if [ -n "$GPU_LINE" ]; then
  rm -f "$OUT/bench_gpu.csv" "$OUT/torch.csv"
  for phase in ${LOCKSTEP_GPU_PHASES:-$GPU_PHASES_DEFAULT}; do
    if ! declare -F "phase_$phase" > /dev/null; then
      say "no phase named $phase (LOCKSTEP_GPU_PHASES)"
      FAILED=1
    elif ((START + BUDGET - $(date +%s) < 45)); then
      PHASES_NOT_RUN="$PHASES_NOT_RUN $phase"
    else
      "phase_$phase"
    fi
  done
  [ -n "$PHASES_NOT_RUN" ] && say "not run, the budget (${BUDGET} s) spent:$PHASES_NOT_RUN"
fi

# ---- The table ----------------------------------------------------------------------------------
{
  echo
  echo "==== lockstep GPU check, $(date -u +%FT%TZ), $(($(date +%s) - START)) s ===="
  echo "GPU          ${GPU_LINE:-none: $NO_GPU_REASON}"
  echo "build        $BUILD_RESULT"
  echo "GPU tests    $TESTS_RESULT"
  echo "bench_gpu    $BENCH_RESULT"
  echo "PyTorch      $TORCH_RESULT"
  echo "GPT parity   $GPT_PARITY_RESULT"
  echo "GPT bench    $GPT_BENCH_RESULT"
  echo "GPT bf16     $GPT_BF16_RESULT"
  echo "micro-batch  $MICROBATCH_RESULT"
  echo "CUDA graphs  $GRAPHS_RESULT"
  grep '^graph_step: ' "$OUT/graphs.log" 2>/dev/null | sed 's/^graph_step: /             /'
  echo "attention    $ATTENTION_RESULT"
  grep -E '^ +1024 |gpu_extra_attention: (bf16 step|fused step)' "$OUT/attention.log" 2> /dev/null
  echo "bf16 model   $BF16_MODEL_RESULT"
  grep '^gpu_extra_bf16_model: gpt_tiny' "$OUT/bf16_model.log" 2>/dev/null | sed 's/^gpu_extra_bf16_model: /             /'
  echo "fused linear $LINEAR_RESULT"
  echo "MLP by op    $MLP_BREAKDOWN_RESULT"
  grep '^mlp_breakdown: ' "$OUT/mlp_breakdown.log" 2>/dev/null | sed 's/^mlp_breakdown: /             /'
  grep '^gpu_extra_linear: ' "$OUT/linear.log" 2>/dev/null | sed 's/^gpu_extra_linear: /             /'
  echo "GPU step     $STEP_RESULT"
  echo "GPU shrink   $SHRINK_RESULT"
  echo "GPU snapshot $SNAPSHOT_RESULT"
  echo "faults      $FAULT_RESULT"
  echo "2 NCCL ranks on 1 GPU: $TWO_PROCESS_RESULT"
  echo "kernels      $KERNELS_RESULT"
  [ -n "$PHASES_NOT_RUN" ] && echo "not run      (budget of $BUDGET s spent):$PHASES_NOT_RUN"
  if [ -s "$OUT/gpt_bench.log" ]; then
    echo
    grep -A4 '^preset ' "$OUT/gpt_bench.log"
  fi
  if [ -s "$OUT/gpt_bench.csv" ]; then
    # GPT-2 124M: lockstep's step time and MFU against PyTorch eager's step time (same GPU).
    awk -F, 'FNR > 1 && $1 == "lockstep" { ms = $5; mfu = $8 }
             FNR > 1 && $1 != "lockstep" { pt = $5; name = $1 }
             END { if (ms == "") exit
                   printf "GPT-2 124M   lockstep %.1f ms per step, MFU %s; %s eager %.1f ms\n",
                     ms, mfu, name, pt }' "$OUT/gpt_bench.csv"
  fi
  if [ -s "$OUT/gpt_bf16.csv" ]; then
    # GPT-2 124M, bf16: step time and MFU of each framework and precision (same GPU).
    awk -F, 'FNR > 1 { printf "GPT-2 124M   %s %s: %.1f ms per step, %.0f tokens/s, MFU %s\n",
                         $1, $2, $6, $7, $8 }' "$OUT/gpt_bf16.csv"
    grep -m1 '^lockstep bf16 / PyTorch at its best' "$OUT/gpt_bf16.log"
  fi
  if [ -s "$OUT/kernels.log" ]; then
    echo
    echo "Kernels (bench_kernels, GPT-2 124M shapes, batch 8):"
    sed 's/^/  /' "$OUT/kernels.log"
  fi
  if [ -s "$OUT/bench_gpu.csv" ]; then
    echo
    grep -m1 '^MLP ' "$OUT/bench_gpu.log"
    echo "One replica on GPU 0, samples/s:"
    csvs=("$OUT/bench_gpu.csv")
    [ -s "$OUT/torch.csv" ] && csvs+=("$OUT/torch.csv")
    awk -F, '
      FNR == 1 { next }
      FILENAME ~ /bench_gpu.csv$/ && $1 == "single" { ls[$2] = $6 }
      FILENAME ~ /bench_gpu.csv$/ && $1 == "peer" { peer[++np] = $0 }
      FILENAME ~ /torch.csv$/ { pt[$2] = $5 }
      END {
        printf "  %-9s %12s %12s %17s\n", "TF32", "lockstep", "PyTorch", "lockstep/PyTorch"
        for (i = 1; i <= 2; ++i) {
          t = i == 1 ? "off" : "on"
          r = (t in pt) && pt[t] > 0 ? sprintf("%.2fx", ls[t] / pt[t]) : "n/a"
          p = (t in pt) ? sprintf("%.0f", pt[t]) : "n/a"
          printf "  %-9s %12.0f %12s %17s\n", t, ls[t], p, r
        }
        print "  (target: lockstep >= 1.30x PyTorch)"
        print ""
        print "N replicas on GPU 0, peer communicator, TF32 off:"
        printf "  %-3s %10s %12s %8s %11s\n", "N", "steps/s", "samples/s", "speedup", "efficiency"
        for (i = 1; i <= np; ++i) {
          split(peer[i], f, ",")
          printf "  %-3s %10.1f %12.0f %8.2f %10.0f%%\n", f[3], f[5], f[6], f[7], 100 * f[8]
        }
      }' "${csvs[@]}"
    echo
    echo "Notes: both sides run forward, softmax cross-entropy, backward and an SGD momentum step"
    echo "in fp32 on synthetic data. lockstep also does work PyTorch's loop does not: its loader"
    echo "assembles each batch on the host and uploads it (PyTorch's batches are already on the"
    echo "GPU), and it reads the loss, accuracy and gradient norm back to the host every step"
    echo "(PyTorch's timed loop never synchronises). lockstep is timed on the host between steps,"
    echo "PyTorch with CUDA events. The replicas of the peer rows share one GPU: efficiency is not"
    echo "expected to approach 100%."
  fi
  echo "logs: $OUT"
} | tee "$OUT/summary.txt"
exit "$FAILED"
