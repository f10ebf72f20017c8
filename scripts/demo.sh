#!/usr/bin/env bash
# Installs what the demo needs on a fresh machine (not Horovod, which only the tests use), then
# trains the legacy TF1 demo on 2 ranks, printing loss and samples/s as it goes.
#
#   scripts/demo.sh [--tf2] [demo_tf1.py's options]
#
# By default on TensorFlow 1.15.5 / Python 3.7, the TensorFlow sok1x's users run (virtual
# environment SOK1X_VENV37, default .venv37/; Python 3.7 found as scripts/setup.sh says:
# SOK1X_PY37, or pyenv's 3.7.16). --tf2 (or SOK1X_DEMO_TF=2) runs it on TensorFlow 2.15 in graph
# mode instead (SOK1X_VENV, default .venv/). SOK1X_DEMO_RANKS changes the number of ranks (2).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tf=${SOK1X_DEMO_TF:-1}
args=()
for arg in "$@"; do
  if [ "$arg" = --tf2 ]; then tf=2; else args+=("$arg"); fi
done
case $tf in
  1|1.15) venv=${SOK1X_VENV37:-$root/.venv37} set=demo37 ;;
  2) venv=${SOK1X_VENV:-$root/.venv} set=demo ;;
  *) echo "demo.sh: SOK1X_DEMO_TF='$tf' (use 1 for TensorFlow 1.15, 2 for 2.15)" >&2; exit 2 ;;
esac
bash "$root/scripts/setup.sh" "$venv" "$set"
export PATH="$venv/bin:$PATH" TF_CPP_MIN_LOG_LEVEL=2
cd "$root/legacy_examples"
exec mpiexec -n "${SOK1X_DEMO_RANKS:-2}" python demo_tf1.py ${args[@]+"${args[@]}"}
