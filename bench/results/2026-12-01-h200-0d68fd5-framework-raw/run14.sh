#!/bin/bash
# device run 14 (2026-12-01, nvidia-h200): dlrm26_split (stopped at the pass's 90 s bound in run 11) with a longer bound; dlrm26_hash again (run 11's process ran at a slow pace); b79e623's sources
repo=$PWD
say() { echo "[$SECONDS s] $*"; }
mkdir -p /tmp/r14
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device-wheels/*.whl 2>&1 | tail -1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . 2>&1 | tail -1
cd /tmp
PYTHONPATH=/tmp/site:$repo/bench SOK1X_BENCH_VARIANTS=sok1x_replayed,sok1x_kernels,sok1x_kernels_replayed,torch_dedup timeout 260 python3 $repo/bench/framework_step.py --workloads dlrm26_split --repeats 5 --out /tmp/r14/fw_split.json > /tmp/r14/fw_split.log 2>&1
say "split rc=$?"; grep -E "ms/step|python_us|pace" /tmp/r14/fw_split.log | cut -c1-400 | head -12
for r in 1 2; do
  PYTHONPATH=/tmp/site:$repo/bench SOK1X_BENCH_VARIANTS=sok1x_replayed,sok1x_kernels_replayed,torch_dedup timeout 120 python3 $repo/bench/framework_step.py --workloads dlrm26_hash --repeats 5 --out /tmp/r14/fw_hash_$r.json > /tmp/r14/fw_hash_$r.log 2>&1
  say "hash $r rc=$?"; grep -E "ms/step" /tmp/r14/fw_hash_$r.log; grep -oE "sok1x_replayed: \{[^}]*\}" /tmp/r14/fw_hash_$r.log | grep -oE "'python_us': [0-9.]+|'host_pace_us': [0-9.]+|'python_us_alone': [0-9.]+" | tr '\n' ' '; echo
done
cd /tmp/r14 && tar czf $OUT/r14.tgz . && ls $OUT
