#!/bin/bash
# device run 8 (2026-12-01, nvidia-h200): where a full group's evicting step with a device reader spends its host time (growth_kernels + cProfile); the replayed hash/dynamic/hybrid steps' host work (host_work --profile)
repo=$PWD
say() { echo "[$SECONDS s] $*"; }
mkdir -p /tmp/r8
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device-wheels/*.whl 2>&1 | tail -1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . 2>&1 | tail -1
cd /tmp
SOK1X_BENCH_PROFILE=/tmp/r8/gk_prof.txt SOK1X_BENCH_PROFILE_LINES=50 PYTHONPATH=/tmp/site:$repo/bench timeout 200 python3 $repo/bench/growth_kernels.py --repeats 3 --out /tmp/r8/gk.json > /tmp/r8/gk.log 2>&1
say "growth_kernels rc=$?"; grep -v "^ \|Warn\|warn" /tmp/r8/gk.log | tail -8
PYTHONPATH=/tmp/site:$repo/bench timeout 200 python3 $repo/bench/host_work.py --backend cuda --workloads dlrm26_hash,dlrm26_dynamic,dlrm26_hybrid,dlrm26 --profile 300 --out /tmp/r8/hw.json > /tmp/r8/hw.log 2>&1
say "host_work rc=$?"; grep "host_us\|calls a step" /tmp/r8/hw.log
cd /tmp/r8 && tar czf $OUT/r8.tgz . && ls $OUT
