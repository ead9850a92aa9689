#!/usr/bin/env bash
# Fetches what a build on the GPU machine needs and its image lacks into DIR (default .devdeps),
# for the device tool to carry there (scripts/gpu_check.sh unpacks it):
#   - the Debian packages of scripts/common.sh's install list that the build links against (its
#     -dev packages; the Python module and MPI are off there), with every library they depend on
#     (scripts/gpu_deps.py): one list, so a new dependency cannot be forgotten here;
#   - the pinned cuDNN frontend's headers (DIR/cudnn_frontend), as scripts/common.sh fetches them.
# Then it checks the load: unpacked into a scratch folder, every library link must resolve inside
# it (a -dev package's .so link points into its runtime package). Run from anywhere, with the
# install list's packages installed here (scripts/test.sh installs them).
#
#   bash scripts/fetch_gpu_deps.sh [DIR]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
dir=$(realpath -m "${1:-$LOCKSTEP_ROOT/.devdeps}")
roots=()
for p in "${LOCKSTEP_PACKAGES[@]}"; do
  case "$p" in
    python3-dev | libopenmpi-dev) ;;  # gpu_check configures without the Python module and MPI
    *-dev) roots+=("$p") ;;
  esac
done
mapfile -t debs < <(python3 "$LOCKSTEP_ROOT/scripts/gpu_deps.py" "${roots[@]}")
mkdir -p "$dir"
rm -f "$dir"/*.deb
ls /var/lib/apt/lists/*_Packages > /dev/null 2>&1 || apt-get update -qq
# apt-get download fetches the version installed here (the one the tests ran against).
versions=()
for p in "${debs[@]}"; do
  versions+=("$p=$(dpkg-query -W -f='${Version}' "$p")")
done
(cd "$dir" && apt-get download -q "${versions[@]}" 2>&1 |
  grep -v -E '^(W: Download is performed unsandboxed|Get:)' || true)
fetch_cudnn_frontend "$dir/cudnn_frontend"
printf '%s\n' "${debs[@]}" > "$dir/packages.txt"

# The load's check, as gpu_check makes it there.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for f in "$dir"/*.deb; do dpkg -x "$f" "$scratch"; done
got=$(ls "$dir"/*.deb | wc -l)
if [ "$got" -ne "${#debs[@]}" ]; then
  echo "fetch_gpu_deps: fetched $got of ${#debs[@]} packages into $dir" >&2
  exit 1
fi
broken=$(cd "$LOCKSTEP_ROOT/scripts" &&
  python3 -B -c 'import sys, gpu_check; print(" ".join(gpu_check.dangling_links(sys.argv[1])))' \
    "$scratch")
if [ -n "$broken" ]; then
  echo "fetch_gpu_deps: links that point nowhere once unpacked: $broken" >&2
  exit 1
fi
echo "fetch_gpu_deps: ${#debs[@]} packages ($(du -sh "$dir" | cut -f1) with the cuDNN frontend)" \
  "in $dir, every library link resolves: ${debs[*]}"
