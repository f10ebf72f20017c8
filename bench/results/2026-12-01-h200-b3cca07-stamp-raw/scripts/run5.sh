#!/bin/bash
# device run 5 (2026-12-01, nvidia-h200): ncu of a bounded dlrm26 step's small kernels
repo=$PWD
say() { echo "[$SECONDS s] $*"; }
mkdir -p /tmp/r5
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device-wheels/*.whl 2>&1 | grep -v "already exists" | tail -1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . 2>&1 | tail -1
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
cd /tmp
PYTHONPATH=/tmp/site:$repo/bench:$repo/.carry-run timeout 240 $ncu --kernel-name "regex:zero_unsummed_rows|place_by_segment|emit_padded_rows|fill_rows_float64|count_segments|mark_rows_below|emit_padded_inverse|scan_word_popcounts|sum_segment_chunks|update_lazy_adam_x4" --launch-skip 30 --launch-count 10 --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section WarpStateStats python3 $repo/.carry-run/small_kernels.py dlrm26 6 > /tmp/r5/ncu.txt 2>&1
say "ncu rc=$?"; grep -E "^  [a-z_0-9]+.*\(|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Grid Size|Block Size|Registers Per|Warp Cycles Per Issued|L2 Hit|Mem Busy" /tmp/r5/ncu.txt | head -120
cd /tmp/r5 && tar czf $OUT/r5.tgz . && ls $OUT
