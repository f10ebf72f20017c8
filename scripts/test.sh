#!/usr/bin/env bash
# Installs everything on a fresh machine, then runs the CPU test suite: the serial tests, then the
# MPI tests as real jobs of 1, 2 and 4 ranks (and 2 ranks again on the host-staging seam). Prints
# one closing total line.
# No GPU needed.
# SOK1X_VENV picks the virtual environment (default: .venv in the repository).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${SOK1X_VENV:-$root/.venv}
bash "$root/scripts/setup.sh" "$venv" test
export PATH="$venv/bin:$PATH"
export TF_CPP_MIN_LOG_LEVEL=2 PYTHONDONTWRITEBYTECODE=1
results=$(mktemp -d)
# Run from outside the repository so that Python imports the installed sok1x, not the sources.
cd "$results"
status=0
python -m pytest -q -p no:cacheprovider --timeout=600 --junitxml="$results/serial.xml" \
  "$root/tests/cpu" || status=$?
# The zero-copy seam (DLPack, the default on this TensorFlow) at 1, 2 and 4 ranks, and host
# staging (what TensorFlow 1.15 gets, forced with SOK1X_SEAM; graph_ops/boundary.py) at 2 ranks:
# which path crosses is decided per op, not by the number of ranks, and 2 ranks already run every
# exchange, so a second pass at 1 and 4 ranks would add CI time and no coverage.
runs=()
for job in dlpack:1 dlpack:2 dlpack:4 host:2; do
  seam=${job%:*} ranks=${job#*:}
  echo "== MPI tests on $ranks ranks, $seam seam"
  SOK1X_SEAM=$seam mpiexec -n "$ranks" python -m pytest -q -p no:cacheprovider --timeout=300 \
    --junitxml="$results/mpi-$ranks-$seam.xml" "$root/tests/mpi" || status=$?
  runs+=("$results/mpi-$ranks-$seam.xml")
done
# Named one by one: a job that aborted wrote no file, and that must count as a failure.
python "$root/scripts/junit_total.py" "$results"/serial.xml "${runs[@]}" || status=1
exit "$status"
