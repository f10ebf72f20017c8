#!/bin/bash
# device run 23 (2026-12-01, nvidia-h200): 7fc81fe's full table alone at load 1.0 beside HierarchicalKV
# (the same lease as run 22, after-site installed by run 21; hkv_grid built by bench/hkv_build.sh
# from HierarchicalKV ae24eec on this project's machine)
cd /tmp && PYTHONPATH=/tmp/after-site:$OLDPWD/bench timeout 330 python3 $OLDPWD/bench/dynamic_table.py --rows-log2 26 --repeats 5 --dims 128,64 --loads 1.0 --shares 0.25,0.5,0.75 --evicted drop --hkv $OLDPWD/.carry-run/hkv_grid --out $OUT/grid.json --markdown $OUT/grid.md > $OUT/grid.log 2>&1
