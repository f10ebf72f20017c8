#!/usr/bin/env bash
# A one-GPU pass for the device eviction (issue 38): this tree's GPU tests ($PASS_SUITES, default
# dynamic-1gpu table-groups-1gpu), growth_step.py of a "before" tree and of this one in
# alternating processes ($PASS_ROUNDS rounds, default 3), a cProfile of this tree's growth_step
# (growth-profile.txt), then framework_step.py's dlrm26_full and dlrm26_hybrid on this tree
# (--repeats 5, --steps $PASS_FRAMEWORK_STEPS, default 10).
#     bash bench/eviction_pass.sh BEFORE_TREE      (from this checkout's root; $OUT)
set -u
here=$(pwd); before=$(cd "${1:?usage: eviction_pass.sh BEFORE_TREE}" && pwd)
source "$here/bench/pass_common.sh"
tests "${PASS_SUITES:-dynamic-1gpu table-groups-1gpu}" tests
for round in $(seq "${PASS_ROUNDS:-3}"); do
  for tree in before after; do
    bench $tree growth_step.py growth_${tree}_$round
    grep -E '^(room|grow|evict)' "$out/growth_${tree}_$round.log" | sed "s/^/  $tree $round: /" \
      >>"$summary"
  done
done
SOK1X_BENCH_PROFILE=$out/growth-profile.txt bench after growth_step.py growth_profiled --repeats 1
workloads=${PASS_FRAMEWORK_WORKLOADS:-dlrm26_full,dlrm26_hybrid}
bench after framework_step.py framework_full --workloads "$workloads" --repeats 5 \
  --steps "${PASS_FRAMEWORK_STEPS:-10}"
grep -E 'ms/step|evict|Error' "$out/framework_full.log" | sed 's/^/  /' >>"$summary"
say "== done"
