#!/usr/bin/env bash
# Issue 18's pass on one GPU, about three minutes, from the repository root (or a copy of it):
#     bash bench/ckpt_pass.sh [WHEELS]     WHEELS: PyCUDA's wheels and their needs (default
#                                          .device-wheels here, else ../../.device-wheels)
#   tests   the cuda checkpoint tests (tests/gpu/run_all.sh's suite checkpoint-1gpu: both load
#           ways, staged and two-pass, forced in turn)
#   stages  bench/checkpoint_stages.py: where a dump and a load of 2M x 128 rows spend their
#           time, with and without the crc32, beside the host's own crc32, write and read rates
#           (CKPT_STAGES_ROWS, CKPT_STAGES_REPEATS, CKPT_STAGES_LIMIT: default 2M rows, 3, 60 s)
#   before  (CKPT_BEFORE=DIR, another checkout, e.g. main's: installed apart) the stage probe
#           of its sok1x, then its own bench/checkpoint_io.py, as "bench" below, into
#           checkpoint_io_10M_1gpu_before.json
#   bench   bench/checkpoint_io.py: dump + load of a 10M x 128 table in /dev/shm, 5 repeats,
#           beside plain writes and a plain read of the same bytes (the load as the engine
#           picks it: staged where the device has room; the JSON's load_ways says which ran)
#   big     (CKPT_BIG_ROWS=N) the same for N x 128 rows, CKPT_BIG_REPEATS repeats (default 5),
#           bounded by CKPT_BIG_LIMIT seconds (default 240) and by what is left of CKPT_TOTAL_S
#           (the whole pass's budget, if set); each round's figures are printed as it ends, so a
#           run cut short still shows them in big.log
# $CKPT_STEPS: the steps to run (default "tests stages before bench big"; stages_before is stages').
# Installs the wheels and sok1x from this checkout into /tmp/ckpt-site and runs from /tmp, so
# the installed package is imported. Logs and JSON go to $OUT (or /tmp/sok1x-ckpt-pass).
set -u
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/sok1x-ckpt-pass}
wheels=${1:-$repo/.device-wheels}
ls "$wheels"/*.whl >/dev/null 2>&1 || wheels=$repo/../../.device-wheels
site=/tmp/ckpt-site
needs=/tmp/ckpt-wheels
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export SOK1X_KERNEL_CACHE_DIR=/tmp/sok1x-kernels
# Each process may use the host's cores (CKPT_BIND=core to see the other case): Open MPI binds
# a job of one or two ranks to one core each, where the checkpoint's file and checksum threads
# share it (one H200 host, 10M rows: dump 47% and load 43% of a plain write and read there, 109%
# and 70% unbound; bench/NOTES.md).
mpi="mpiexec --bind-to ${CKPT_BIND:-none}"
mkdir -p "$out"
rm -rf "$site" "$needs" "$site-before"
python3 -m pip install -q --no-index --no-deps --target "$needs" "$wheels"/*.whl || exit 1
install() {  # checkout, folder
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --target "$2" "$1"
}
install "$repo" "$site" || exit 1
before=${CKPT_BEFORE:-}
if [ -n "$before" ]; then
  before=$(cd "$before" && pwd) && install "$before" "$site-before" || exit 1
fi
export PYTHONPATH=$site:$needs
cd /tmp
status=0
step() {  # name, seconds, command...
  local name=$1 limit=$2; shift 2
  case " ${CKPT_STEPS:-tests stages before bench big} " in
    *" ${name%_before} "*) ;;
    *) return ;;
  esac
  local start=$SECONDS
  timeout -k 5 "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || status=1
  echo "== $name rc=$rc $((SECONDS - start)) s"
  tail -n 25 "$out/$name.log"
}
step tests 90 env SOK1X_TEST_BACKEND=cuda $mpi -n 1 python3 -m pytest -q -p no:cacheprovider \
  --color=no "$repo/tests/mpi/test_sharded_checkpoint.py" "$repo/tests/mpi/test_checkpoint.py"
step stages "${CKPT_STAGES_LIMIT:-60}" $mpi -n 1 python3 "$repo/bench/checkpoint_stages.py" \
  --backend cuda --rows "${CKPT_STAGES_ROWS:-2000000}" --dir /dev/shm \
  --repeats "${CKPT_STAGES_REPEATS:-3}" --out "$out/checkpoint_stages_1gpu.json"
if [ -n "$before" ]; then
  step stages_before 60 env PYTHONPATH="$site-before:$needs" $mpi -n 1 python3 \
    "$repo/bench/checkpoint_stages.py" --backend cuda --rows 2000000 --dir /dev/shm --repeats 3 \
    --out "$out/checkpoint_stages_2M_1gpu_before.json"
  step before 90 env PYTHONPATH="$site-before:$needs" $mpi -n 1 python3 \
    "$before/bench/checkpoint_io.py" --backend cuda --rows 10000000 --dir /dev/shm --repeats 5 \
    --out "$out/checkpoint_io_10M_1gpu_before.json"
fi
step bench 100 $mpi -n 1 python3 "$repo/bench/checkpoint_io.py" --backend cuda \
  --rows 10000000 --dir /dev/shm --repeats 5 --out "$out/checkpoint_io_10M_1gpu.json"
big_limit=${CKPT_BIG_LIMIT:-240}
if [ -n "${CKPT_TOTAL_S:-}" ] && [ $((CKPT_TOTAL_S - SECONDS - 15)) -lt "$big_limit" ]; then
  big_limit=$((CKPT_TOTAL_S - SECONDS - 15))
fi
if [ -n "${CKPT_BIG_ROWS:-}" ] && [ "$big_limit" -gt 30 ]; then
  step big "$big_limit" $mpi -n 1 python3 "$repo/bench/checkpoint_io.py" \
    --backend cuda --rows "$CKPT_BIG_ROWS" --dir /dev/shm --repeats "${CKPT_BIG_REPEATS:-5}" \
    --sample 20000 --out "$out/checkpoint_io_big_1gpu.json"
fi
rm -rf /dev/shm/sok1x-checkpoint-io /dev/shm/sok1x-checkpoint-stages
exit $status
