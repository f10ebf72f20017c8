#!/bin/bash
# device run 1 (2026-11-30): GPU suites on the warp pick, growth A/B, dlrm26_full control
repo=$PWD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
say() { echo "[$SECONDS s] $*"; }
python3 -m pip install -q --no-index --no-deps --target /tmp/sok1x-site .device-wheels/*.whl 2>&1 | tail -1
cp -r /tmp/sok1x-site /tmp/before-site
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/sok1x-site . 2>&1 | tail -1
(cd .carry-before && python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/before-site . 2>&1 | tail -1)
say installed
mkdir -p $OUT/suites
SOK1X_SUITE_TIMEOUT_S=200 SOK1X_SUITES="dynamic-1gpu table-groups-1gpu replayed-keyed-1gpu" OUT=$OUT/suites timeout 330 bash tests/gpu/run_all.sh 1 > $OUT/suites.log 2>&1
say "suites rc=$?"; grep -hE "passed|failed|error" $OUT/suites.log | tail -8
cd /tmp
for round in 1 2; do
  for tree in before after; do
    site=/tmp/sok1x-site; [ $tree = before ] && site=/tmp/before-site
    PYTHONPATH=$site:$repo/bench timeout 150 python3 $repo/bench/growth_kernels.py --repeats 5 --out $OUT/growth_${tree}_$round.json > $OUT/growth_${tree}_$round.log 2>&1
    say "growth $tree $round rc=$?"; grep -E "wall|room:" $OUT/growth_${tree}_$round.log | grep -v "^ " ; grep -E "evict_pick|evict_drop /" $OUT/growth_${tree}_$round.log | head -3
  done
done
