#!/usr/bin/env bash
# Creates (or updates) the virtual environment $1 with what $2 needs:
#   test (default)  TensorFlow 2.15 (CPU), the MPICH wheel and mpi4py, pytest, Horovod, and sok1x,
#                   on the python3 on PATH
#   demo            TensorFlow 2.15 (CPU), the MPICH wheel and mpi4py, and sok1x: no Horovod, which
#                   the demo never imports (building it takes minutes)
#   test37          TensorFlow 1.15.5 on Python 3.7 (the TensorFlow sok1x's users run): the MPICH
#                   wheel, mpi4py 3.1.6 built with that wheel's mpicc, pytest, Horovod 0.28.1 (it
#                   builds against TensorFlow 1.15.5; SOK1X_HOROVOD37_VERSION names another
#                   release, or none when set empty), and sok1x
#   demo37          the same without the test tools and Horovod
# Python 3.7 is found as $SOK1X_PY37, else pyenv's 3.7.16 ($(pyenv root)/versions/3.7.16), else
# python3.7 on PATH.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=$(realpath -m "${1:-$root/.venv}")  # absolute: pip builds mpi4py elsewhere, with its mpicc
what=${2:-test}
case $what in
  test|demo) python=python3 ;;
  test37|demo37)
    python=${SOK1X_PY37:-}
    if [ -z "$python" ] && command -v pyenv >/dev/null 2>&1; then
      python=$(pyenv root)/versions/3.7.16/bin/python
    fi
    if [ -z "$python" ] || [ ! -x "$python" ]; then
      python=$(command -v python3.7 || true)
    fi
    if [ -z "$python" ] || ! "$python" -c 'import sys; assert sys.version_info[:2] == (3, 7)' \
        >/dev/null 2>&1; then
      echo "setup.sh: no Python 3.7 for TensorFlow 1.15 (looked at \$SOK1X_PY37," \
           "\$(pyenv root)/versions/3.7.16/bin/python and python3.7 on PATH). Install one" \
           "('pyenv install 3.7.16') or set SOK1X_PY37=/path/to/python3.7." >&2
      exit 2
    fi ;;
  *) echo "setup.sh: unknown set '$what' (use test, demo, test37 or demo37)" >&2; exit 2 ;;
esac
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
fi
"$venv/bin/python" -m pip install -q -r "$root/requirements-$what.txt"
case $what in
  test37|demo37)
    # mpi4py from its source, against the MPICH wheel just installed (its mpicc in the venv's
    # bin/): there is no mpi4py 3.1.6 wheel for Linux, and a system MPI must not be picked up.
    # Never from pip's wheel cache: the library embeds the lib/ of the venv that built it as
    # RUNPATH, so a wheel built for another venv fails to load libmpi once that venv is gone.
    if ! "$venv/bin/python" -c 'import mpi4py; assert mpi4py.__version__ == "3.1.6"
from mpi4py import MPI' >/dev/null 2>&1; then
      PATH="$venv/bin:$PATH" MPICC="$venv/bin/mpicc" \
        "$venv/bin/python" -m pip install -q --no-cache-dir --force-reinstall --no-deps \
        --no-binary mpi4py "mpi4py==3.1.6"
    fi ;;
esac
if [ "$what" = test ]; then
  bash "$root/scripts/install_horovod.sh" "$venv/bin/python"
fi
if [ "$what" = test37 ] && [ -n "${SOK1X_HOROVOD37_VERSION-0.28.1}" ]; then
  SOK1X_HOROVOD_VERSION=${SOK1X_HOROVOD37_VERSION-0.28.1} \
    bash "$root/scripts/install_horovod.sh" "$venv/bin/python"
fi
# Non-editable on purpose: the tests must see exactly what a user's `pip install` gets.
# A stale build/ folder would ship modules that no longer exist in the sources.
rm -rf "$root/build"
"$venv/bin/python" -m pip install -q --no-deps --force-reinstall "$root"
