#!/bin/bash
# device run 16 (2026-12-01, nvidia-h200): c9e0a1d's evicting step kernel by kernel; Nsight Compute of evict_pick (stalls, memory)
repo=$PWD
say() { echo "[$SECONDS s] $*"; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device-wheels/*.whl 2>&1 | tail -1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . 2>&1 | tail -1
say installed
cd /tmp
PYTHONPATH=/tmp/site:$repo/bench timeout 150 python3 $repo/bench/growth_kernels.py --repeats 3 --ways room,evict_drop --out $OUT/growth.json > $OUT/growth.log 2>&1
say "growth rc=$?"; grep -vE "^\s*$" $OUT/growth.log | head -60
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
PYTHONPATH=/tmp/site:$repo/bench timeout 200 $ncu --kernel-name regex:"evict_pick|init_rows|touch_rows" --launch-skip 12 --launch-count 3 --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats --section SchedulerStats --section SourceCounters python3 $repo/bench/growth_step.py --ways evict_drop --repeats 1 --out /tmp/g.json > $OUT/ncu.txt 2>&1
say "ncu rc=$?"; grep -E "evict_pick|init_rows|touch_rows|Duration|Throughput|Achieved Occupancy|Registers|Stall|Warp Cycles|Block Limit|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|Grid Size|Block Size|Theoretical Occ|Eligible|Issued Warp" $OUT/ncu.txt | head -90
