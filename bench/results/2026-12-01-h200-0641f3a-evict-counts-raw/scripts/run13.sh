#!/bin/bash
# device run 13 (2026-12-01, nvidia-h200): growth_step's ways and dlrm26_full's uncaptured step with the one-rank bounded step off and on, alternated in one process (bounded_ab.py), two processes
repo=$PWD
say() { echo "[$SECONDS s] $*"; }
mkdir -p /tmp/r13
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device-wheels/*.whl 2>&1 | tail -1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . 2>&1 | tail -1
cd /tmp
for p in 1 2; do
  PYTHONPATH=/tmp/site:$repo/bench timeout 200 python3 $repo/.carry-run/bounded_ab.py 6 6 /tmp/r13/ab_$p.json > /tmp/r13/ab_$p.log 2>&1
  say "ab $p rc=$?"; grep -E "median|pace" /tmp/r13/ab_$p.log
done
cp $repo/.carry-run/bounded_ab.py /tmp/r13/
cd /tmp/r13 && tar czf $OUT/r13.tgz . && ls $OUT
