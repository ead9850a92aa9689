#!/usr/bin/env bash
# The tokenizer's numbers for bench/RESULTS.md, in one run:
#   1. single-thread encode MB/s, lockstep (bench_tokenizer) against tiktoken 0.7.0 (its Rust
#      core, one thread) on the same text: Shakespeare x8 (English, 1 MB) and the generated
#      Unicode text of the reference test (every script, 1.3 MB);
#   2. `lockstep tokenize` on 1 core against 2 (taskset), ROUNDS alternating rounds, on 20
#      files (26 MB): wall seconds and MB/s.
#   3. the families, single thread, on the same two texts: GPT-2 (its rank file; `tokenizers`
#      with its vocab.json + merges.txt), Llama 3 and Qwen (their real rank files against
#      tiktoken with their patterns), and the tokenizer.json files of the families' kinds the
#      interop test trains (against `tokenizers` 0.19.1).
#   bench/measure_tokenizer.sh [BUILD_DIR] [ROUNDS]
# Needs the environments of tests/interop/tiktoken_venv.sh and hf_venv.sh, and the rank files of
# family_rank_files.sh (each made here when missing).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
rounds="${2:-3}"
mapfile -t ref < <(bash "$root/tests/interop/tiktoken_venv.sh" "$build")
python="${ref[0]}" ranks="${ref[1]}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for _ in 1 2 3 4 5 6 7 8; do cat "$root/third_party/shakespeare/as_you_like_it.txt"; done > "$work/shakespeare8.txt"
"$python" "$root/tests/interop/tokenizer_reference.py" unicode "$work/unicode.txt"

echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load: $(cut -d' ' -f1-3 /proc/loadavg)"
for text in shakespeare8.txt unicode.txt; do
  echo "== single thread, $text ($(stat -c %s "$work/$text") bytes)"
  taskset -c 0 "$build/bench/bench_tokenizer" "$ranks" "$work/$text" 5
  taskset -c 0 "$python" "$root/tests/interop/tokenizer_reference.py" bench "$ranks" "$work/$text" 5
done

inputs=()
for i in $(seq 1 10); do
  cp "$work/shakespeare8.txt" "$work/s$i.txt"
  cp "$work/unicode.txt" "$work/u$i.txt"
  inputs+=("$work/s$i.txt" "$work/u$i.txt")
done
echo "== lockstep tokenize, 20 files ($(cat "${inputs[@]}" | wc -c) bytes); load: $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq 1 "$rounds"); do
  for cores in 0 0,1; do
    start=$(date +%s.%N)
    taskset -c "$cores" "$build/lockstep" tokenize --tokenizer "$ranks" --out "$work/out.bin" \
      "${inputs[@]}" > /dev/null
    end=$(date +%s.%N)
    echo "round $round, cores $cores: $(echo "$end - $start" | bc) s"
  done
done

# 3. The families.
mapfile -t real < <(bash "$root/tests/interop/family_rank_files.sh" "$build")
hf_python="$(bash "$root/tests/interop/hf_venv.sh" "$build" | tail -1)"
families="$root/tests/interop/tokenizer_families.py"
"$hf_python" "$families" hf "$work/trained" > /dev/null
"$python" "$root/tests/interop/tokenizer_reference.py" hf "$ranks" "$work/gpt2-hf"
for text in shakespeare8.txt unicode.txt; do
  echo "== families, single thread, $text; load: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "-- gpt2 (vocab.json + merges.txt)"
  taskset -c 0 "$build/bench/bench_tokenizer" "$work/gpt2-hf" "$work/$text" 5
  taskset -c 0 "$hf_python" "$families" bench-hf "$work/gpt2-hf" "$work/$text" 5
  for i in 0 1; do
    family=(llama3 qwen2)
    echo "-- ${family[$i]} (${real[$i]##*/}, --tokenizer-family ${family[$i]})"
    taskset -c 0 "$build/bench/bench_tokenizer" "${real[$i]}" "$work/$text" 5 "${family[$i]}"
    taskset -c 0 "$python" "$families" bench-tiktoken "${family[$i]}" "${real[$i]}" "$work/$text" 5
  done
  for family in llama3 qwen2 smollm2; do
    echo "-- $family-like tokenizer.json (3,000 ids, trained by the interop test's script)"
    taskset -c 0 "$build/bench/bench_tokenizer" "$work/trained/$family/tokenizer.json" "$work/$text" 5
    taskset -c 0 "$hf_python" "$families" bench-hf "$work/trained/$family/tokenizer.json" "$work/$text" 5
  done
done

# 4. Memory: the peak resident size of `lockstep tokenize` (2 threads) on 12 bytes, and on a
# 50 MB line with no space or newline (one pre-token; Note [Long pre-tokens] and the forced cuts
# of Note [Tokenizing files]), and the same as a .jsonl line (parsed whole).
echo "== memory: peak resident size of lockstep tokenize; load: $(cut -d' ' -f1-3 /proc/loadavg)"
printf 'hello world\n' > "$work/tiny.txt"
head -c 50000000 /dev/zero | tr '\0' 'a' > "$work/line50.txt"
for input in tiny.txt line50.txt; do
  /usr/bin/time -f "$input: %M KB peak, %e s" "$build/lockstep" tokenize --tokenizer "$ranks" \
    --out "$work/out.bin" "$work/$input" > /dev/null
done
