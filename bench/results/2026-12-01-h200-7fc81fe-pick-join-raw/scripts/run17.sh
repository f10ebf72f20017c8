#!/bin/bash
# device run 17 (2026-12-01, nvidia-h200): Nsight Compute of c9e0a1d's evict_pick in growth_step's evicting steps (stalls, memory, source)
repo=$PWD
say() { echo "[$SECONDS s] $*"; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device-wheels/*.whl 2>&1 | tail -1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . 2>&1 | tail -1
say installed
cd /tmp
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
PYTHONPATH=/tmp/site:$repo/bench timeout 250 $ncu --kernel-name evict_pick --launch-skip 2 --launch-count 1 --set full --import-source no -o $OUT/pick python3 $repo/bench/growth_step.py --ways evict_drop --repeats 1 --out /tmp/g.json > $OUT/ncu_run.txt 2>&1
say "ncu rc=$?"; tail -5 $OUT/ncu_run.txt
$ncu --import $OUT/pick.ncu-rep --page details > $OUT/pick_details.txt 2>&1
$ncu --import $OUT/pick.ncu-rep --page raw --csv > $OUT/pick_raw.csv 2>&1
grep -E "Duration|Throughput|Occupancy|Registers|Stall|Warp Cycles|Block Limit|Hit Rate|Mem Busy|Max Bandwidth|Grid Size|Block Size|Eligible|Issued|Shared Memory" $OUT/pick_details.txt | head -70
