# Shared by quickstart.sh and test.sh: install missing Debian packages, configure and build.
# Sourced, not run.

LOCKSTEP_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOCKSTEP_BUILD="${LOCKSTEP_BUILD:-$LOCKSTEP_ROOT/build}"
# What the build needs (the README's dependency section and third_party/README.md list the same),
# and what the test suite adds: PyTorch (CPU) for the parity tests, venv for the interop tests'
# environment with transformers from PyPI. scripts/check_packages.sh checks that the build and
# those tests read no file of a package outside these lists and what they depend on.
LOCKSTEP_PACKAGES=(cmake g++ make libtbb-dev libfmt-dev doctest-dev libyaml-cpp-dev libopenblas-dev
  libdnnl-dev libpcre2-dev libopenmpi-dev openmpi-bin)
LOCKSTEP_TEST_PACKAGES=(python3-torch python3-venv)

install_missing_packages() {
  local missing=()
  for p in "${LOCKSTEP_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "installing: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

configure_and_build() {
  cmake -S "$LOCKSTEP_ROOT" -B "$LOCKSTEP_BUILD" -DCMAKE_BUILD_TYPE=Release "$@"
  cmake --build "$LOCKSTEP_BUILD" -j "$(nproc)"
}
