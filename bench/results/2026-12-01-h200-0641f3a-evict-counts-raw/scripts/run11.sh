#!/bin/bash
# device run 11 (2026-12-01, nvidia-h200): evict_drop and evict_device cases alive in one process, alternated, phase by phase (reader_phases.py); then the framework pass of 1a60283's sources, every workload but mlperf26
repo=$PWD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
say() { echo "[$SECONDS s] $*"; }
mkdir -p /tmp/r11
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device-wheels/*.whl 2>&1 | tail -1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . 2>&1 | tail -1
cd /tmp
PYTHONPATH=/tmp/site:$repo/bench timeout 150 python3 $repo/.carry-run/reader_phases.py 6 6 /tmp/r11/phases.json > /tmp/r11/phases.log 2>&1
say "phases rc=$?"; grep -v "^ \|Warn\|warn" /tmp/r11/phases.log | tail -8
cp $repo/.carry-run/reader_phases.py /tmp/r11/
cd /tmp/r11 && tar czf $OUT/r11.tgz . && cd $repo
SOK1X_BENCH_VARIANTS=sok1x_replayed,sok1x_kernels,sok1x_kernels_replayed,torch_dedup SOK1X_FRAMEWORK_ARGS="--repeats 5" SOK1X_FRAMEWORK_LIMIT_S=90 OUT=$OUT/pass timeout 480 bash bench/pass.sh --limit 470 framework=seed,dlrm,dlrm26,dlrm26_hash,dlrm26_dynamic,dlrm26_hybrid,dlrm26_full,dlrm26_split > /tmp/pass.log 2>&1
say "pass rc=$?"; tail -30 $OUT/pass/summary.txt 2>/dev/null || tail -30 /tmp/pass.log
ls $OUT $OUT/pass
