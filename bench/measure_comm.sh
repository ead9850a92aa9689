#!/bin/bash
# Issue 18's four comparisons in one run, each figure beside its reference from the same run:
#   1. in-process all-reduce busbw against one thread's memcpy and gloo (2 and 4 ranks);
#   2. the share of communication hidden on the emulated link, overlap off and on (N = 1, 2, 4),
#      and bench_train's scaling on the real shared-memory all-reduce;
#   3. training against PyTorch DDP (small and large MLP, N = 1, 2);
#   4. across 2 processes: lockstep's MPI all-reduce against the MPI library's blocking
#      MPI_Allreduce (skipped without mpirun or without the MPI build).
# Run it on an idle machine: it took under 3 minutes on 2 cores (bench/RESULTS.md). Every output file goes to
# OUT (default build/bench/comm), with the CPU model and the load average before each part in
# OUT/machine.txt.
#
#   bash bench/measure_comm.sh [OUT] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/bench/comm}
rounds=${2:-3}
py=/usr/bin/python3
mkdir -p "$out"

note() {
  echo "$1: load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%H:%M:%S)" | tee -a "$out/machine.txt"
}
: > "$out/machine.txt"
grep -m1 'model name' /proc/cpuinfo | tee -a "$out/machine.txt"
echo "cpus: $(nproc)" | tee -a "$out/machine.txt"

note "in-process all-reduce"
$py bench/compare_allreduce.py --rounds "$rounds" --out "$out/allreduce"
note "overlap and scaling"
$py bench/scaling.py --runs "$rounds" --train --out "$out/scaling"
note "against PyTorch DDP"
$py bench/compare_ddp.py --pairs "$rounds" --out "$out/ddp"

if command -v mpirun > /dev/null && [[ -x build/bench/bench_mpi_allreduce ]]; then
  note "across 2 processes"
  mpi=(mpirun --oversubscribe -np 2)
  [[ $(id -u) == 0 ]] && mpi=(mpirun --allow-run-as-root --oversubscribe -np 2)
  for round in $(seq "$rounds"); do
    "${mpi[@]}" build/bench/bench_allreduce --reps 20 --max-mb 64 --csv "$out/mpi_lockstep_$round.csv"
    "${mpi[@]}" build/bench/bench_mpi_allreduce --reps 20 --max-mb 64 --csv "$out/mpi_blocking_$round.csv"
  done
fi
note "done"
