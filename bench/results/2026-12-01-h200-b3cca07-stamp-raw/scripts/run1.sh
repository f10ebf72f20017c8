#!/bin/bash
# device run 1 (2026-12-01, nvidia-h200): what the GPU does in a one-rank replayed step (gpu_busy.py), dlrm26, dlrm, dlrm26_hash
repo=$PWD
say() { echo "[$SECONDS s] $*"; }
mkdir -p /tmp/r1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device-wheels/*.whl 2>&1 | tail -1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . 2>&1 | tail -1
cd /tmp
for w in dlrm26 dlrm dlrm26_hash; do
  PYTHONPATH=/tmp/site:$repo/bench SOK1X_BOUNDED_STEP=1 timeout 100 python3 $repo/bench/gpu_busy.py $w 20 replayed > /tmp/r1/busy1_$w.log 2>&1
  say "$w rc=$?"; grep -A30 "rank 0 of" /tmp/r1/busy1_$w.log
done
cd /tmp/r1 && tar czf $OUT/r1.tgz . && ls $OUT
