#!/usr/bin/env bash
# Installs what the demo needs on a fresh machine (not Horovod, which only the tests use), then
# trains the legacy TF1 demo on 2 ranks, printing loss and samples/s as it goes.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${SOK1X_VENV:-$root/.venv}
bash "$root/scripts/setup.sh" "$venv" demo
export PATH="$venv/bin:$PATH" TF_CPP_MIN_LOG_LEVEL=2
cd "$root/legacy_examples"
exec mpiexec -n 2 python demo_tf1.py "$@"
