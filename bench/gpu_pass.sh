#!/usr/bin/env bash
# One benchmark pass on a GPU machine (no TensorFlow needed), from the repository root:
#     bash bench/gpu_pass.sh STAGE...      stages: micro hybrid profile steps1 steps group tests
#                                          framework checkpoint
#   micro    rows.py (gather / scatter-add vs copy, candidate kernels beside) and hash_table.py
#   hybrid   host_rows.py (mapped host-row rates per allocation way and region size) and
#            dynamic_breakdown.py (where one find_or_insert call's time goes, bare and engine)
#   profile  Nsight Compute over profile_kernels.py (SpeedOfLight, Occupancy) -> ncu.txt
#   steps1   step_and_exchange.py on 1 GPU
#   steps    step_and_exchange.py on 1, 2 and 4 GPUs (as many as there are, up to 4)
#   group    group_lookup.py (one fused lookup of 26 tables vs 26 lookups) on 1 and 4 GPUs
#   tests    the GPU tests of the kernels bench/ may have changed (rows.cu, optimizers)
#   checkpoint  checkpoint_io.py: dump + load of a 10M x 128 table on 1 and 4 GPUs beside the
#            disk's plain write/read ($SOK1X_CKPT_DIR, default /tmp/sok1x-ckpt-io), then a 1M-row
#            table on cuda and on cpu, whose value digests must agree
#   framework  framework_step.py on 1 and every GPU count up to the machine's (1, 2, 4, 8), then
#            framework_report.py -> $OUT/framework.{json,md,png}
#            ($SOK1X_FRAMEWORK_WORKLOADS: which workloads; $SOK1X_FRAMEWORK_LIMIT_S: s per count)
# Installs the wheels in $SOK1X_BENCH_WHEELS (default .device-wheels/: PyCUDA and its needs, and a
# sok1x wheel; without one, sok1x from this checkout) into /tmp/site and runs from /tmp, so that
# the installed package is imported. JSON and logs go to $OUT (or /tmp/sok1x-bench).
# SOK1X_ROWS_CANDIDATE / SOK1X_ROWS_LABEL: another rows.cu to time beside the installed one.
set -u
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/sok1x-bench}
bench=$repo/bench
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export SOK1X_KERNEL_CACHE_DIR=/tmp/sok1x-kernels
mkdir -p "$out"
log=$out/log.txt
rm -rf /tmp/site
wheels=$repo/${SOK1X_BENCH_WHEELS:-.device-wheels}
if ls "$wheels"/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site "$wheels"/*.whl
fi
# Asked from /tmp: from the repository root the sources would import and hide a missing install.
(cd /tmp && python3 -c "import sys; sys.path.insert(0, '/tmp/site'); import sok1x") 2>/dev/null || {
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site \
    "$repo" || exit 1; }
export PYTHONPATH=/tmp/site
cd /tmp
gpus=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=index,name,clocks.sm,clocks.mem,memory.used --format=csv >>"$log"
stage() {  # name, seconds, command...
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  echo "== $name" | tee -a "$log"
  timeout "$limit" "$@" 2>&1 | tee -a "$log" | grep -vE "^\s*$" | tail -40
  echo "== $name rc=${PIPESTATUS[0]} $((SECONDS - start)) s" | tee -a "$log"
}
for what in "$@"; do
  case $what in
    micro)
      stage rows 70 python3 "$bench/rows.py" --out "$out/rows.json" \
        --candidate "$repo/${SOK1X_ROWS_CANDIDATE:-bench/kernels/rows_candidate.cu}" \
        --candidate-label "${SOK1X_ROWS_LABEL:-candidate}"
      stage hash 100 python3 "$bench/hash_table.py" --out "$out/hash.json"
      stage dynamic 150 python3 "$bench/dynamic_table.py" --out "$out/dynamic.json" ;;
    hybrid)
      stage host-rows 150 python3 "$bench/host_rows.py" --out "$out/host_rows.json"
      stage breakdown 60 python3 "$bench/dynamic_breakdown.py" --out "$out/breakdown.json" ;;
    profile)
      echo "== profile" >>"$log"
      ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu \
        2>/dev/null | head -1)
      timeout 90 "$ncu" --clock-control none --section SpeedOfLight --section Occupancy \
        --section LaunchStats -k regex:'take_rows|add_rows|hash_|unique_claim|owner_|update_lazy' \
        python3 "$bench/profile_kernels.py" \
        --candidate "$repo/${SOK1X_ROWS_CANDIDATE:-bench/kernels/rows_candidate.cu}" \
        >"$out/ncu.txt" 2>&1
      echo "== profile rc=$? $(grep -c 'Duration' "$out/ncu.txt") kernels" | tee -a "$log" ;;
    steps1)
      stage steps-1 130 mpiexec -n 1 python3 "$bench/step_and_exchange.py" --out "$out/w1.json" ;;
    steps)
      for n in 1 2 4; do
        [ "$n" -le "$gpus" ] || continue
        stage "steps-$n" 90 mpiexec -n "$n" python3 "$bench/step_and_exchange.py" \
          --out "$out/w$n.json"
      done ;;
    framework)
      files=()
      # Each workload in a process of its own: what one leaves in the GPU's memory pools
      # cannot crowd the next out (at 1 GPU, seed then dlrm did not fit one H200 together).
      workloads=${SOK1X_FRAMEWORK_WORKLOADS:-seed,dlrm,dlrm26,mlperf26}
      for n in 1 2 4 8; do
        [ "$n" -le "$gpus" ] || continue
        for w in ${workloads//,/ }; do
          stage "framework-$n-$w" "${SOK1X_FRAMEWORK_LIMIT_S:-240}" mpiexec -n "$n" python3 \
            "$bench/framework_step.py" --out "$out/fw$n-$w.json" --workloads "$w"
          files+=("$out/fw$n-$w.json")
        done
      done
      stage framework-report 60 python3 "$bench/framework_report.py" --name framework \
        --out "$out" "${files[@]}" ;;
    group)
      for n in 1 2 4 8; do
        [ "$n" -le "$gpus" ] || continue
        stage "group-$n" 120 mpiexec -n "$n" python3 "$bench/group_lookup.py" \
          --out "$out/group$n.json"
      done ;;
    checkpoint)
      dir=${SOK1X_CKPT_DIR:-/tmp/sok1x-ckpt-io}
      for n in 1 4; do
        [ "$n" -le "$gpus" ] || continue
        # unbound: Open MPI gives 1 or 2 ranks one core each, too few for the I/O threads
        stage "checkpoint-$n" 500 mpiexec --bind-to none -n "$n" python3 "$bench/checkpoint_io.py" \
          --backend cuda --dir "$dir" --repeats 2 --out "$out/checkpoint$n.json"
      done
      for backend in cuda cpu; do
        stage "checkpoint-digest-$backend" 300 mpiexec --bind-to none -n 1 python3 \
          "$bench/checkpoint_io.py" \
          --backend "$backend" --rows 1000000 --dir "$dir" --repeats 1 --digest \
          --out "$out/checkpoint-digest-$backend.json"
      done
      digests=$(grep -h values_digest "$out"/checkpoint-digest-*.json | sort -u | wc -l)
      echo "== checkpoint digests: $digests distinct (1 = cuda equals cpu)" | tee -a "$log"
      rm -rf "$dir" ;;
    tests)
      stage test-backend 120 python3 -m pytest -q -p no:cacheprovider \
        "$repo/tests/gpu/test_cuda_backend.py"
      for n in 2 4; do
        [ "$n" -le "$gpus" ] || continue
        stage "test-nccl-$n" 90 mpiexec -n "$n" python3 -m pytest -q -p no:cacheprovider \
          "$repo/tests/gpu/test_nccl_collectives.py"
      done
      stage test-engine 90 mpiexec -n "$gpus" python3 -m pytest -q -p no:cacheprovider \
        "$repo/tests/gpu/test_engine_cuda.py" ;;
  esac
done
