#!/usr/bin/env bash
# Issue 18's pass on one GPU, about two minutes, from the repository root (or a copy of it):
#     bash bench/ckpt_pass.sh [WHEELS]     WHEELS: PyCUDA's wheels and their needs (default
#                                          .device-wheels here, else ../../.device-wheels)
#   tests  the cuda checkpoint tests (tests/gpu/run_all.sh's suite checkpoint-1gpu: both load
#          ways, staged and two-pass, forced in turn)
#   bench  bench/checkpoint_io.py: dump + load of a 10M x 128 table in /dev/shm, 5 repeats,
#          beside a plain parallel write and read of the same bytes (the load as the engine
#          picks it: staged where the device has room; the JSON's load_ways says which ran)
# Installs the wheels and sok1x from this checkout into /tmp/ckpt-site and runs from /tmp, so
# the installed package is imported. Logs and JSON go to $OUT (or /tmp/sok1x-ckpt-pass).
set -u
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/sok1x-ckpt-pass}
wheels=${1:-$repo/.device-wheels}
ls "$wheels"/*.whl >/dev/null 2>&1 || wheels=$repo/../../.device-wheels
site=/tmp/ckpt-site
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export SOK1X_KERNEL_CACHE_DIR=/tmp/sok1x-kernels
mkdir -p "$out"
rm -rf "$site"
python3 -m pip install -q --no-index --no-deps --target "$site" "$wheels"/*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target "$site" "$repo" \
  || exit 1
export PYTHONPATH=$site
cd /tmp
status=0
step() {  # name, seconds, command...
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout -k 5 "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || status=1
  echo "== $name rc=$rc $((SECONDS - start)) s"
  tail -n 25 "$out/$name.log"
}
step tests 60 env SOK1X_TEST_BACKEND=cuda mpiexec -n 1 python3 -m pytest -q -p no:cacheprovider \
  --color=no "$repo/tests/mpi/test_sharded_checkpoint.py" "$repo/tests/mpi/test_checkpoint.py"
step bench 80 mpiexec -n 1 python3 "$repo/bench/checkpoint_io.py" --backend cuda \
  --rows 10000000 --dir /dev/shm --repeats 5 --out "$out/checkpoint_io_10M_1gpu.json"
rm -rf /dev/shm/sok1x-checkpoint-io
exit $status
