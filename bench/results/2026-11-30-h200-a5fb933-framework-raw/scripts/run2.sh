#!/bin/bash
# device run 2 (2026-11-30): cProfile of replayed vs kernels-replayed steps; dlrm26_split; growth_kernels smoke
repo=$PWD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
say() { echo "[$SECONDS s] $*"; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device-wheels/*.whl 2>&1 | tail -1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . 2>&1 | tail -1
say installed
cd /tmp
export PYTHONPATH=/tmp/site:$repo/bench
for w in dlrm26 dlrm26_hybrid; do
  SOK1X_BENCH_PROFILE=$OUT/prof-$w.txt SOK1X_BENCH_PROFILE_RAW=1 SOK1X_BENCH_PROFILE_LINES=70 \
  SOK1X_BENCH_VARIANTS=sok1x_replayed,sok1x_kernels_replayed timeout 150 python3 $repo/bench/framework_step.py --workloads $w --repeats 5 --out $OUT/fw_prof_$w.json > $OUT/fw_prof_$w.log 2>&1
  say "prof $w rc=$?"; grep -E "ms/step" $OUT/fw_prof_$w.log
done
SOK1X_BENCH_VARIANTS=sok1x_replayed,sok1x_kernels,sok1x_kernels_replayed,torch_dedup timeout 200 python3 $repo/bench/framework_step.py --workloads dlrm26_split --repeats 5 --out $OUT/fw1-dlrm26_split.json > $OUT/fw_split.log 2>&1
say "split rc=$?"; grep -E "ms/step|took" $OUT/fw_split.log
timeout 100 python3 $repo/bench/growth_kernels.py --repeats 1 --out $OUT/growth_kernels_smoke.json > $OUT/gk.log 2>&1
say "growth_kernels rc=$?"; grep -E "evict_pick|/ room|wall" $OUT/gk.log | head -6; tail -3 $OUT/gk.log
