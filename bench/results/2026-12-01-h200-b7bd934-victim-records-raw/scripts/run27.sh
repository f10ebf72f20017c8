#!/bin/bash
# device run 27 (2026-12-01, nvidia-h200): f5649ad (after) against 4c93219 (before): framework_step
# dlrm26_full alternated twice (replayed, torch_dedup; device and bounded); cuda-backend on after
repo=$PWD
say() { echo "[$SECONDS s] $*"; }
python3 -m pip install -q --no-index --no-deps --target /tmp/base-site .device-wheels/*.whl 2>&1 | tail -1
for t in before after; do
  cp -r /tmp/base-site /tmp/$t-site; src=.carry-$t; [ $t = after ] && src=.
  (cd $src && python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/$t-site . 2>&1 | tail -1)
done
say installed
cd /tmp
for tree in after before after before; do
  SOK1X_BENCH_VARIANTS=sok1x_replayed,torch_dedup PYTHONPATH=/tmp/$tree-site:$repo/bench timeout 120 python3 $repo/bench/framework_step.py --workloads dlrm26_full --repeats 5 --out /tmp/fw_${tree}_$SECONDS.json > $OUT/fw_${tree}_$SECONDS.log 2>&1
  say "framework dlrm26_full $tree rc=$?"; grep -hE "replayed 1 ranks|torch_dedup   1|device  1|of sok1x_replayed" $(ls -t $OUT/fw_${tree}_*.log | head -1) | sed -E "s/'(fills|copies|data_collectives|mpi_exchanges|gc_gen0|gc_gen1|gc_gen2|gc_us)': [0-9.]+, //g" | cut -c1-260
done
cd $repo
SOK1X_SUITE_TIMEOUT_S=200 SOK1X_SUITES="cuda-backend" OUT=/tmp/suites bash tests/gpu/run_all.sh 1 > /tmp/suites.log 2>&1
say "suites rc=$?"; grep -E "passed|failed|error" /tmp/suites.log | tail -4
