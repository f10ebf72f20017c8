#!/bin/bash
# device run 19 (2026-12-01, nvidia-h200): Nsight Compute of f92363a's evict_pick (source counters by SASS line)
repo=$PWD
say() { echo "[$SECONDS s] $*"; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device-wheels/*.whl 2>&1 | tail -1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . 2>&1 | tail -1
say installed
cd /tmp
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
PYTHONPATH=/tmp/site:$repo/bench timeout 250 $ncu --kernel-name evict_pick --launch-skip 2 --launch-count 1 --set full --import-source no -o $OUT/pick2 python3 $repo/bench/growth_step.py --ways evict_drop --repeats 1 --out /tmp/g.json > $OUT/ncu_run.txt 2>&1
say "ncu rc=$?"
$ncu --import $OUT/pick2.ncu-rep --page details > $OUT/pick2_details.txt 2>&1
$ncu --import $OUT/pick2.ncu-rep --page source --csv --print-source sass > $OUT/sass2.csv 2>&1
grep -E "Duration|Throughput|Occupancy|Registers|Warp Cycles|Hit Rate|Eligible|Issued Instructions  |Spilling" $OUT/pick2_details.txt | head -30
