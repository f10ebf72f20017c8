#!/bin/bash
# device run 2 (2026-11-30): growth_step, dlrm26_full control, the load-1.0 grid beside HKV
repo=$PWD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
say() { echo "[$SECONDS s] $*"; }
[ -d /tmp/sok1x-site/sok1x ] || { python3 -m pip install -q --no-index --no-deps --target /tmp/sok1x-site .device-wheels/*.whl; python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/sok1x-site . ; } 2>&1 | tail -1
say installed
cd /tmp
export PYTHONPATH=/tmp/sok1x-site:$repo/bench
timeout 100 python3 $repo/bench/growth_step.py --ways room,evict_drop,evict_device --repeats 5 --out $OUT/growth_step.json > $OUT/growth_step.log 2>&1
say "growth_step rc=$?"; grep -E "rank\(s\)" $OUT/growth_step.log
SOK1X_BOUNDED_STEP=1 SOK1X_BENCH_VARIANTS=sok1x_replayed,torch_dedup timeout 120 python3 $repo/bench/framework_step.py --workloads dlrm26_full --out $OUT/fw_full.json > $OUT/fw_full.log 2>&1
say "fw rc=$?"; tail -4 $OUT/fw_full.log
timeout 330 python3 $repo/bench/dynamic_table.py --rows-log2 26 --repeats 5 --dims 64,128 --loads 1.0 --shares 0.25,0.5,0.75 --evicted drop --hkv $repo/.carry-run/hkv_grid --out $OUT/grid.json --markdown $OUT/grid.md > $OUT/grid.log 2>&1
say "grid rc=$?"; grep -E "HierarchicalKV share|hybrid share" $OUT/grid.log
