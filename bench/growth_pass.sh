#!/usr/bin/env bash
# A one-GPU pass for a change to the steps that grow or evict: this tree's GPU tests (run_all.sh
# suites, $PASS_SUITES, default dynamic-1gpu and table-groups-1gpu), then growth_step.py of a
# "before" tree and of this one in alternating processes ($PASS_ROUNDS rounds, default 2, of
# before then after), each timed by this checkout's bench script, then a cProfile of this tree's
# ways (growth-profile.txt).
#     bash bench/growth_pass.sh BEFORE_TREE      (from this checkout's root; $OUT)
# $PASS_LIMIT_S (default 380) bounds the whole pass: each stage gets what is left.
set -u
here=$(pwd); before=$(cd "${1:?usage: growth_pass.sh BEFORE_TREE}" && pwd)
source "$here/bench/pass_common.sh"
tests "${PASS_SUITES:-dynamic-1gpu table-groups-1gpu}" tests
for round in $(seq "${PASS_ROUNDS:-2}"); do
  for tree in before after; do
    bench $tree growth_step.py growth_${tree}_$round
    grep -E '^(room|grow|evict)' "$out/growth_${tree}_$round.log" | sed "s/^/  $tree $round: /" \
      >>"$summary"
  done
done
SOK1X_BENCH_PROFILE=$out/growth-profile.txt bench after growth_step.py growth_profiled --repeats 1
say "== done"
