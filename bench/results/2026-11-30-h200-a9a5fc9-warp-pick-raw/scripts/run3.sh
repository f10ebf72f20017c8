#!/bin/bash
# device run 3 (2026-11-30): the pick's gather, four trees; suites; ncu of evict_pick
repo=$PWD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
say() { echo "[$SECONDS s] $*"; }
python3 -m pip install -q --no-index --no-deps --target /tmp/base-site .device-wheels/*.whl 2>&1 | tail -1
for t in before mid g8 after; do
  cp -r /tmp/base-site /tmp/$t-site; src=.carry-$t; [ $t = after ] && src=.
  (cd $src && python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/$t-site . 2>&1 | tail -1)
done
say installed
cd /tmp
for tree in before mid g8 after mid g8 after; do
  PYTHONPATH=/tmp/$tree-site:$repo/bench timeout 100 python3 $repo/bench/growth_kernels.py --repeats 5 --ways room,evict_drop --out $OUT/growth_${tree}_$SECONDS.json > $OUT/growth_$tree.log 2>&1
  say "growth $tree rc=$?"; grep -E "wall" $OUT/growth_$tree.log | grep -v "^ "; grep -E "evict_pick|evict_drop /" $OUT/growth_$tree.log | head -2
done
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
PYTHONPATH=/tmp/after-site:$repo/bench timeout 150 $ncu --kernel-name evict_pick --launch-skip 6 --launch-count 1 --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats python3 $repo/bench/growth_step.py --ways evict_drop --repeats 1 --out /tmp/g.json > $OUT/ncu.txt 2>&1
say "ncu rc=$?"; grep -E "Duration|Throughput|Achieved Occupancy|Registers|Stall|Warp Cycles|Block Limit|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|Grid Size|Theoretical Occ" $OUT/ncu.txt | head -40
cd $repo
SOK1X_SUITE_TIMEOUT_S=200 SOK1X_SUITES="dynamic-1gpu table-groups-1gpu" OUT=$OUT/suites timeout 250 bash tests/gpu/run_all.sh 1 > $OUT/suites.log 2>&1
say "suites rc=$?"; grep -hE "passed|failed|error" $OUT/suites.log | tail -4
