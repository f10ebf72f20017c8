#!/usr/bin/env bash
# Creates (or updates) the virtual environment $1 with what $2 needs:
#   test (default)  TensorFlow (CPU), the MPICH wheel and mpi4py, pytest, Horovod, and sok1x
#   demo            TensorFlow (CPU), the MPICH wheel and mpi4py, and sok1x: no Horovod, which
#                   the demo never imports (building it takes minutes)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$root/.venv}
what=${2:-test}
case $what in
  test|demo) ;;
  *) echo "setup.sh: unknown set '$what' (use test or demo)" >&2; exit 2 ;;
esac
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
fi
"$venv/bin/python" -m pip install -q -r "$root/requirements-$what.txt"
if [ "$what" = test ]; then
  bash "$root/scripts/install_horovod.sh" "$venv/bin/python"
fi
# Non-editable on purpose: the tests must see exactly what a user's `pip install` gets.
# A stale build/ folder would ship modules that no longer exist in the sources.
rm -rf "$root/build"
"$venv/bin/python" -m pip install -q --no-deps --force-reinstall "$root"
