#!/bin/bash
# device run 15 (2026-12-01, nvidia-h200): 489ed7d's GPU suites (a one-rank reader reads what forwards left first)
repo=$PWD
say() { echo "[$SECONDS s] $*"; }
mkdir -p /tmp/r15
SOK1X_SUITE_TIMEOUT_S=200 SOK1X_SUITES="dynamic-1gpu table-groups-1gpu replayed-keyed-1gpu bounded-step-1gpu" OUT=/tmp/r15/suites timeout 400 bash tests/gpu/run_all.sh 1 > /tmp/r15/suites.log 2>&1
say "suites rc=$?"; grep -hE "^== " /tmp/r15/suites.log; grep -h -B2 -A20 "^FAILED\|Error" /tmp/r15/suites/*.log | head -40
cd /tmp/r15 && tar czf $OUT/r15.tgz . && ls $OUT
