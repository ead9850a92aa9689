#!/usr/bin/env bash
# Makes (once) the reference for the tokenizer tests: a virtual environment in the build tree
# with tiktoken from PyPI, pinned, and GPT-2's rank file taken from the openai-whisper source
# distribution, pinned (whisper/assets/gpt2.tiktoken: 50,256 ranks; the one file extracted, the
# package not installed). Prints the interpreter's path on the first line and the rank file's
# on the second; exits non-zero when they cannot be made (no network, no python3-venv), which
# the tests report as a skip.
#   tests/interop/tiktoken_venv.sh BUILD_DIR
set -euo pipefail
readonly TIKTOKEN=tiktoken==0.7.0
readonly WHISPER=openai-whisper==20240930
# pip download prepares an sdist's metadata, which runs whisper's setup.py, which imports
# pkg_resources: a setuptools that still has it, used in place (--no-build-isolation).
readonly SETUPTOOLS="setuptools==75.8.0"
venv="$1/python-tiktoken"
ranks="$venv/gpt2.tiktoken"
# CTest runs cases in parallel: one makes the environment, the others wait for it.
mkdir -p "$1"
exec 9>"$venv.lock"
flock 9
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c 'import tiktoken' 2>/dev/null ||
   [[ ! -s "$ranks" ]]; then
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv" >&2
  "$venv/bin/python" -m pip install --disable-pip-version-check --quiet "$TIKTOKEN" "$SETUPTOOLS" >&2
  download="$(mktemp -d)"
  trap 'rm -rf "$download"' EXIT
  "$venv/bin/python" -m pip download --disable-pip-version-check --quiet --no-deps \
    --no-binary :all: --no-build-isolation --dest "$download" "$WHISPER" >&2
  sdist="$(ls "$download"/openai*whisper-*.tar.gz)"
  member="$(tar -tzf "$sdist" | grep '/whisper/assets/gpt2.tiktoken$')"
  tar -xzf "$sdist" -O "$member" > "$ranks.part"
  mv "$ranks.part" "$ranks"
fi
"$venv/bin/python" -c 'import tiktoken' >&2
[[ "$(wc -l < "$ranks")" -eq 50256 ]] || { echo "$ranks: expected 50256 ranks" >&2; exit 1; }
echo "$venv/bin/python"
echo "$ranks"
