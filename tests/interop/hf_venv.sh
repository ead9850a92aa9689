#!/usr/bin/env bash
# Makes (once) and names the Python that the Hugging Face interop test uses: a virtual
# environment in the build tree that sees Debian's torch (--system-site-packages) and has
# transformers from PyPI, pinned. Prints the interpreter's path; exits non-zero when it cannot
# be made (no network, no python3-venv), which the test reports as a skip.
#   tests/interop/hf_venv.sh BUILD_DIR
set -euo pipefail
readonly TRANSFORMERS=transformers==4.40.2
# apply_chat_template's renderer (tests/interop/chat_template.py)
readonly JINJA2=jinja2==3.1.4
# PEFT for the LoRA interop test; without its dependencies, which would replace Debian's torch
# by a newer one (accelerate 0.29 is the last to take torch 1.13; the rest come with transformers).
readonly PEFT=(peft==0.10.0 accelerate==0.29.3)
venv="$1/python-hf"
# CTest runs cases in parallel: one makes the environment, the others wait for it.
exec 9>"$venv.lock"
flock 9
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c 'import transformers, peft' 2>/dev/null; then
  rm -rf "$venv"
  /usr/bin/python3 -m venv --system-site-packages "$venv" >&2
  "$venv/bin/python" -m pip install --disable-pip-version-check --quiet "$TRANSFORMERS" >&2
  "$venv/bin/python" -m pip install --disable-pip-version-check --quiet --no-deps "${PEFT[@]}" >&2
fi
# Not fatal: only the chat template test needs it, and it skips without it.
if ! "$venv/bin/python" -c 'import jinja2' 2>/dev/null; then
  "$venv/bin/python" -m pip install --disable-pip-version-check --quiet "$JINJA2" >&2 ||
    echo "hf_venv.sh: could not install $JINJA2" >&2
fi
"$venv/bin/python" -c 'import torch, transformers, peft' >&2
echo "$venv/bin/python"
