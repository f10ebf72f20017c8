#!/bin/bash
# device run 10 (2026-12-01, nvidia-h200): the evicting step's counts read in its forward (old) or left to its backward's header (new), alternated in one process (inplace_ab.py), two processes
repo=$PWD
say() { echo "[$SECONDS s] $*"; }
mkdir -p /tmp/r10
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device-wheels/*.whl 2>&1 | tail -1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . 2>&1 | tail -1
cd /tmp
for p in 1 2; do
  PYTHONPATH=/tmp/site:$repo/bench timeout 200 python3 $repo/.carry-run/inplace_ab.py 6 6 /tmp/r10/ab_$p.json > /tmp/r10/ab_$p.log 2>&1
  say "ab $p rc=$?"; grep -E "median|pace" /tmp/r10/ab_$p.log
done
cp $repo/.carry-run/inplace_ab.py /tmp/r10/
cd /tmp/r10 && tar czf $OUT/r10.tgz . && ls $OUT
