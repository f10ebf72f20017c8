#!/bin/bash
# device run 25 (2026-12-01, nvidia-h200): 9126b5d (after) against 4c93219 (before): growth_kernels
# alternated twice (all kernels listed); ncu of touch_rows in evict_drop; GPU suites on after
repo=$PWD
say() { echo "[$SECONDS s] $*"; }
python3 -m pip install -q --no-index --no-deps --target /tmp/base-site .device-wheels/*.whl 2>&1 | tail -1
for t in before after; do
  cp -r /tmp/base-site /tmp/$t-site; src=.carry-$t; [ $t = after ] && src=.
  (cd $src && python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/$t-site . 2>&1 | tail -1)
done
say installed
cd /tmp
for tree in before after before after; do
  PYTHONPATH=/tmp/$tree-site:$repo/bench timeout 100 python3 $repo/bench/growth_kernels.py --repeats 3 --top 40 --ways room,evict_drop,evict_device --out $OUT/growth_${tree}_$SECONDS.json > $OUT/g_${tree}_$SECONDS.log 2>&1
  say "growth $tree rc=$?"; grep -hE "wall|evict_unserved|move_rows|hash_erase|evict_pick" $(ls -t $OUT/g_${tree}_*.log | head -1)
done
PYTHONPATH=/tmp/after-site:$repo/bench timeout 120 ncu --kernel-name touch_rows --launch-skip 4 --launch-count 4 --section SpeedOfLight --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis --section WarpStateStats python3 $repo/bench/growth_step.py --ways evict_drop --repeats 1 --out /tmp/g.json > $OUT/ncu_touch.log 2>&1
say "ncu touch rc=$?"; grep -E "Duration|Throughput|Grid Size|Block Size|Registers|Achieved Occupancy|Stall" $OUT/ncu_touch.log | head -80
cd $repo
PYTHONPATH=/tmp/after-site SOK1X_SUITE_TIMEOUT_S=200 SOK1X_SUITES="dynamic-1gpu cuda-backend table-groups-1gpu replayed-keyed-1gpu" OUT=$OUT/suites bash tests/gpu/run_all.sh 1 > $OUT/suites.log 2>&1
say "suites rc=$?"; grep -E "passed|failed|error" $OUT/suites.log | tail -12
