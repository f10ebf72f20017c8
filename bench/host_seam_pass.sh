#!/usr/bin/env bash
# TensorFlow 1.15's GPU step on one GPU (issue 36): the host seam's GPU test, then
# framework_step.py's dlrm and dlrm26 with the host variants beside the device step, in one
# process per workload (their variants interleaved). From this checkout's root, $OUT for logs:
#     bash bench/host_seam_pass.sh
set -u
here=$(pwd); out=${OUT:-/tmp/sok1x-host-seam}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export SOK1X_KERNEL_CACHE_DIR=/tmp/sok1x-kernels
rm -rf /tmp/after  # a warm machine may hold another tree there
python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/wheels .device-wheels/*.whl \
  >/dev/null 2>&1 || exit 1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/after . \
  >"$out/install.log" 2>&1 || { echo "install failed"; tail "$out/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
cd /tmp
PYTHONPATH=/tmp/wheels:/tmp/after timeout 240 mpiexec -n 1 python3 -m pytest -q \
  -p no:cacheprovider --color=no "$here/tests/gpu/test_host_seam_cuda.py" >"$out/test.log" 2>&1
echo "host-seam test rc=$?: $(tail -1 "$out/test.log")"
for workload in ${PASS_WORKLOADS:-dlrm dlrm26}; do
  PYTHONPATH=/tmp/wheels:/tmp/after:$here/bench timeout "${PASS_BENCH_S:-150}" mpiexec -n 1 \
    python3 "$here/bench/framework_step.py" --out "$out/fw_$workload.json" \
    --workloads "$workload" --repeats "${PASS_REPEATS:-5}" --steps "${PASS_STEPS:-20}" \
    >"$out/fw_$workload.log" 2>&1
  echo "$workload rc=$?"; grep -E "ms/step|page-locked|Error|error" "$out/fw_$workload.log" | head -20
done
