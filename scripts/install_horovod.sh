#!/usr/bin/env bash
# Installs Horovod 0.28.1, or the release SOK1X_HOROVOD_VERSION names (TensorFlow + MPI ops only:
# no Gloo, PyTorch, MXNet or GPU ops), into the environment of a Python interpreter, building it
# from the sdist against that environment's TensorFlow and the `mpich` PyPI wheel's MPI (mpicxx in
# the venv's bin/).
#
#   scripts/install_horovod.sh [PYTHON]        # default: python3 on PATH
#
# Needs in that environment: tensorflow(-cpu), numpy, and mpicxx (e.g. `pip install mpich`);
# a C++17 compiler (g++) on PATH. cmake is taken from PATH if >= 3.13, else pip-installed.
# Idempotent: exits at once when `import horovod.tensorflow` already gives that release with MPI.
#
# Knobs (environment):
#   HOROVOD_BUILD_JOBS      parallel compile jobs (default: number of cores)
#   SOK1X_HOROVOD_DEBUG=1   keep -g debug info (default: dropped, ~30% less compile time)
#   SOK1X_HOROVOD_CACHE     where built wheels are kept, keyed by interpreter, venv path,
#                           TensorFlow and MPI versions (default ~/.cache/sok1x/horovod);
#                           set to an empty string to neither read nor write it.
set -euo pipefail

HVD_VERSION=${SOK1X_HOROVOD_VERSION:-0.28.1}
PY_ARG=${1:-python3}
PY=$(command -v "$PY_ARG" || true)
if [ -z "$PY" ]; then
    echo "install_horovod: no python '$PY_ARG'" >&2
    exit 2
fi

check_installed() {
    "$PY" - "$HVD_VERSION" >/dev/null 2>&1 <<'EOF'
import os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import horovod
import horovod.tensorflow as hvd  # loads horovod/tensorflow/mpi_lib*.so
assert horovod.__version__ == sys.argv[1], horovod.__version__
assert hvd.mpi_built()
EOF
}

if check_installed; then
    echo "install_horovod: horovod $HVD_VERSION (tensorflow, MPI) already works in $PY; nothing to do"
    exit 0
fi

# The interpreter's own bin/ first on PATH: the venv's mpicc/mpicxx (mpich wheel) and cmake.
VENV_BIN=$("$PY" -c 'import os, sys; print(os.path.join(sys.prefix, "bin"))')
export PATH="$VENV_BIN:$PATH"

if ! command -v mpicxx >/dev/null 2>&1; then
    echo "install_horovod: no mpicxx in $VENV_BIN or on PATH; install an MPI first" \
         "(e.g. '$PY -m pip install mpich')" >&2
    exit 2
fi
MPICXX=$(command -v mpicxx)
MPI_PREFIX=$(cd "$(dirname "$MPICXX")/.." && pwd)
if ! "$PY" -c 'import tensorflow' >/dev/null 2>&1; then
    echo "install_horovod: tensorflow does not import in $PY; install it first" >&2
    exit 2
fi

# setup.py runs in this environment (--no-build-isolation): it needs setuptools, wheel, packaging.
if ! "$PY" -c 'import setuptools, wheel, packaging' >/dev/null 2>&1; then
    "$PY" -m pip install -q "setuptools<81" wheel packaging
fi

# cmake >= 3.13 (horovod's minimum); below 4 (third_party CMakeLists ask for 2.8.12).
cmake_ok() {
    local v
    v=$(cmake --version 2>/dev/null | sed -n 's/^cmake version \([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p')
    [ -n "$v" ] || return 1
    "$PY" -c 'import sys; v = tuple(int(x) for x in sys.argv[1].split(".")); sys.exit(0 if (3, 13) <= v < (4, 0) else 1)' "$v"
}
if ! cmake_ok; then
    echo "install_horovod: no usable cmake on PATH; installing the cmake wheel"
    "$PY" -m pip install -q "cmake>=3.18,<4"
    hash -r
    cmake_ok || { echo "install_horovod: cmake still unusable" >&2; exit 2; }
fi
REAL_CMAKE=$(command -v cmake)

WORK=$(mktemp -d "${TMPDIR:-/tmp}/sok1x-horovod.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
LOG="${TMPDIR:-/tmp}/sok1x-horovod-build.log"   # kept after the run, for inspection
: >"$LOG"

# Horovod's setup.py calls `$HOROVOD_CMAKE <src> -D...` then `$HOROVOD_CMAKE --build .`.
# The wrapper adds, to the configure step only: no debug info (RelWithDebInfo's "-O2 -g", which
# horovod turns into -O3 -g, becomes -O3), and no CUDA language probing (GPU ops are not built;
# without this an nvcc on PATH gets probed, which costs time and can fail the configure).
cat > "$WORK/cmake" <<EOF
#!/bin/sh
case "\$1" in --build|--install|--version|-E) exec "$REAL_CMAKE" "\$@" ;; esac
exec "$REAL_CMAKE" "\$@" \\
    -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON -DCMAKE_CUDA_COMPILER=OFF \\
    \${SOK1X_HOROVOD_CMAKE_FLAGS_RELWITHDEBINFO:+"-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=\$SOK1X_HOROVOD_CMAKE_FLAGS_RELWITHDEBINFO"}
EOF
chmod +x "$WORK/cmake"
if [ "${SOK1X_HOROVOD_DEBUG:-0}" != "1" ]; then
    export SOK1X_HOROVOD_CMAKE_FLAGS_RELWITHDEBINFO="-O2 -DNDEBUG"
fi

export HOROVOD_CMAKE="$WORK/cmake"
export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1
export HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_GLOO=1
unset HOROVOD_GPU HOROVOD_GPU_OPERATIONS HOROVOD_GPU_ALLREDUCE HOROVOD_GPU_ALLGATHER \
      HOROVOD_GPU_BROADCAST HOROVOD_GPU_ALLTOALL HOROVOD_GPU_REDUCESCATTER HOROVOD_CUDA_HOME || true
export MPI_HOME="$MPI_PREFIX"       # FindMPI hint: the venv's MPI, not some system one
JOBS=${HOROVOD_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}
export MAKEFLAGS="-j$JOBS"          # setup.py passes its own -j8 only when MAKEFLAGS is unset
export CMAKE_BUILD_PARALLEL_LEVEL="$JOBS"

# Wheel cache key: the built library embeds the venv's lib/ as RUNPATH (libmpi.so.12) and the
# TensorFlow ABI, so a wheel is only reused for the same interpreter, prefix, TF and MPI.
CACHE_ROOT=${SOK1X_HOROVOD_CACHE-${XDG_CACHE_HOME:-$HOME/.cache}/sok1x/horovod}
CACHE_DIR=""
if [ -n "$CACHE_ROOT" ]; then
    KEY=$("$PY" - "$HVD_VERSION" "$MPI_PREFIX" "${SOK1X_HOROVOD_DEBUG:-0}" <<'EOF'
import hashlib, sys
try:
    from importlib import metadata
    def version(name):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None
except ImportError:  # Python 3.7
    import pkg_resources
    def version(name):
        try:
            return pkg_resources.get_distribution(name).version
        except pkg_resources.DistributionNotFound:
            return None
def ver(*names):
    for n in names:
        if version(n) is not None:
            return n + "=" + version(n)
    return "-"
parts = [sys.argv[1], sys.version, sys.prefix, sys.argv[2], sys.argv[3],
         ver("tensorflow-cpu", "tensorflow", "tf-nightly"), ver("mpich"), ver("numpy")]
print(hashlib.sha256("|".join(parts).encode()).hexdigest()[:16])
EOF
)
    CACHE_DIR="$CACHE_ROOT/$KEY"
fi

install_wheel() {
    "$PY" -m pip install -q --force-reinstall --no-deps "$1" &&
    "$PY" -m pip install -q "$1" &&
    check_installed
}

shopt -s nullglob
CACHED=()
if [ -n "$CACHE_DIR" ]; then
    CACHED=("$CACHE_DIR"/horovod-"$HVD_VERSION"-*.whl)
fi
if [ "${#CACHED[@]}" -gt 0 ]; then
    WHL=${CACHED[0]}
    echo "install_horovod: installing cached wheel $WHL"
    if install_wheel "$WHL" >"$LOG" 2>&1; then
        echo "install_horovod: horovod $HVD_VERSION installed from cache into $PY"
        exit 0
    fi
    echo "install_horovod: cached wheel did not work; rebuilding" >&2
    tail -n 20 "$LOG" >&2 || true
    rm -f "$WHL"
fi

echo "install_horovod: building horovod $HVD_VERSION for $PY (mpicxx: $MPICXX, cmake: $REAL_CMAKE, -j$JOBS); log: $LOG"
START=$SECONDS
if ! "$PY" -m pip wheel -v --no-deps --no-build-isolation --no-cache-dir --no-binary horovod \
        -w "$WORK/wheel" "horovod==$HVD_VERSION" >"$LOG" 2>&1; then
    echo "install_horovod: horovod build FAILED after $((SECONDS - START))s; first error lines:" >&2
    grep -n -m 15 -E "CMake Error|error:|Error [0-9]|fatal" "$LOG" >&2 || true
    echo "install_horovod: last 60 lines of $LOG:" >&2
    tail -n 60 "$LOG" >&2
    exit 1
fi
BUILD_S=$((SECONDS - START))
BUILT=("$WORK"/wheel/horovod-"$HVD_VERSION"-*.whl)
if [ "${#BUILT[@]}" -eq 0 ]; then
    echo "install_horovod: pip reported success but left no wheel; see $LOG" >&2
    exit 1
fi
WHL=${BUILT[0]}
if ! install_wheel "$WHL" >>"$LOG" 2>&1; then
    echo "install_horovod: installing/importing the built wheel FAILED; last 60 lines of $LOG:" >&2
    tail -n 60 "$LOG" >&2
    exit 1
fi
if [ -n "$CACHE_DIR" ]; then
    mkdir -p "$CACHE_DIR" && cp "$WHL" "$CACHE_DIR/" || echo "install_horovod: could not cache the wheel (ignored)" >&2
fi
echo "install_horovod: horovod $HVD_VERSION built in ${BUILD_S}s and installed into $PY (total $((SECONDS - START))s)"
