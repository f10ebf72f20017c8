#!/bin/bash
# device run 3 (2026-11-30, nvidia-h200-x2): what the GPU does in a replayed step at 2 ranks (gpu_busy.py), dlrm26_full, dlrm26_hash, dlrm26
repo=$PWD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
say() { echo "[$SECONDS s] $*"; }
mkdir -p /tmp/r3
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device-wheels/*.whl 2>&1 | tail -1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . 2>&1 | tail -1
cd /tmp
for w in dlrm26_full dlrm26_hash dlrm26; do
  PYTHONPATH=/tmp/site:$repo/bench SOK1X_BOUNDED_STEP=1 SOK1X_PEER_CAPACITY=1 timeout 120 mpiexec -n 2 python3 $repo/bench/gpu_busy.py $w 20 replayed > /tmp/r3/busy2_$w.log 2>&1
  say "$w rc=$?"; grep -A14 "rank 0 of" /tmp/r3/busy2_$w.log
done
PYTHONPATH=/tmp/site:$repo/bench SOK1X_BOUNDED_STEP=1 timeout 100 python3 $repo/bench/gpu_busy.py dlrm26_full 20 replayed > /tmp/r3/busy1_dlrm26_full.log 2>&1
say "1 rank dlrm26_full rc=$?"; grep -A14 "rank 0 of" /tmp/r3/busy1_dlrm26_full.log
cd /tmp/r3 && tar czf $OUT/r3.tgz . && ls $OUT
