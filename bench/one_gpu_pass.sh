#!/usr/bin/env bash
# A whole pass on one GPU, in stages, this tree ("after") beside a "before" tree in the same
# lease; each stage's figures come from processes of both trees, alternated where they are
# compared:
#     bash bench/one_gpu_pass.sh BEFORE_TREE STAGE...        (from this checkout's root; $OUT)
#   tests      run_all.sh's one-GPU suites of this tree named in $PASS_SUITES (default: the
#              table, hash, ordering, engine, seam and group suites)
#   grid       dynamic_table.py, dim 64 (or $PASS_DIMS), hbm and hybrid at 1/4, 1/2 and 3/4 of the vectors in
#              host memory, loads 0.5 and 0.75, with HierarchicalKV's routine beside it
#              ($HKV_BINARY, bench/hkv_build.sh's output) -> grid.md
#   grid-ab    dynamic_table.py at load 0.5, dim 64, hbm, 1/2 and 3/4 host: before, after,
#              before, after (each its own process)
#   breakdown  dynamic_breakdown.py of both trees at hbm and at 3/4 host
#   framework  framework_step.py at one GPU, the workloads in $PASS_WORKLOADS (default seed dlrm
#              dlrm26; dlrm's tables and PyTorch's copies need an H200 at full scale) each in
#              its own process, before, after, before, after, each tree timed by its own script
#              ($PASS_SCALE divides batch and vocabulary, default 1: dlrm26 beside its PyTorch
#              peer needs 2 on an H100)
# $PASS_LIMIT_S (default 560) bounds the whole pass: each stage gets what is left.
set -u
here=$(pwd); before=$(cd "${1:?usage: one_gpu_pass.sh BEFORE_TREE STAGE...}" && pwd)
shift
# Resolved here: pass_common.sh leaves the shell in /tmp.
hkv=; [ -n "${HKV_BINARY:-}" ] && hkv=$(readlink -f "$HKV_BINARY")
export PASS_LIMIT_S=${PASS_LIMIT_S:-560}
source "$here/bench/pass_common.sh"
framework() {  # tree, workload, name: each tree timed by its own framework_step.py
  local scripts=$here/bench; [ "$1" = before ] && scripts=$before/bench
  PYTHONPATH=/tmp/wheels:/tmp/$1:$scripts timeout "$(left)" mpiexec -n 1 python3 \
    "$scripts/framework_step.py" --out "$out/$3.json" --workloads "$2" --scale "${PASS_SCALE:-1}" \
    >"$out/$3.log" 2>&1
  say "$3 rc=$?: $(grep -E 'ms/step|host waits|launches' "$out/$3.log" | tr -s ' ' | tr '\n' ';')"
}
grid="--rows-log2 24 --repeats 7 --dims ${PASS_DIMS:-64}"
for stage in "$@"; do
  case $stage in
    tests)
      tests "${PASS_SUITES:-hash-values host-order dynamic-1gpu cuda-backend engine-1gpu seam-1gpu table-groups-1gpu v2-engine-1gpu}" tests ;;
    grid)
      bench after dynamic_table.py grid $grid --loads 0.5,0.75 --shares 0,0.25,0.5,0.75 \
        --hkv "${hkv:?set HKV_BINARY to the binary bench/hkv_build.sh made}" --markdown "$out/grid.md" ;;
    grid-ab)
      for round in 1 2; do
        for tree in before after; do
          bench $tree dynamic_table.py grid_${tree}_$round $grid --loads 0.5 --shares 0,0.5,0.75
        done
      done ;;
    breakdown)
      for share in 0 0.75; do
        for tree in before after; do
          bench $tree dynamic_breakdown.py breakdown_${tree}_$share --dim 64 --share $share
        done
      done ;;
    framework)
      for round in 1 2; do
        for tree in before after; do
          for workload in ${PASS_WORKLOADS:-seed dlrm dlrm26}; do
            framework $tree $workload fw_${tree}_${workload}_$round
          done
        done
      done ;;
    *) say "unknown stage $stage" ;;
  esac
done
say "== done"
