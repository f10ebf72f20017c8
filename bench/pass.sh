#!/usr/bin/env bash
# Every GPU benchmark pass, in stages, from this checkout's root (no TensorFlow needed):
#     bash bench/pass.sh [OPTIONS] STAGE...
# Options:
#   --before TREE     another sok1x checkout (e.g. `git archive main` unpacked), installed apart;
#                     the *-ab stages time it and this tree ("after") in alternating processes
#   --hkv BINARY      bench/hkv_build.sh's output (HierarchicalKV's routine) for grid, hkv-grid
#   --hkv-src DIR     a HierarchicalKV checkout: BINARY is built again here when it does not run
#   --wheels DIR      PyCUDA's wheels and their needs (default .device-wheels, else two folders
#                     up, a .devtree copy; $SOK1X_BENCH_WHEELS is read too)
#   --limit S         bounds the whole pass ($PASS_LIMIT_S, default 560): each stage gets the
#                     smaller of its own bound and what is left
#   --no-compile      skip compiling every kernel family into the shared cache before the stages
#   --list            print the stages and presets, and exit
#   --digest          print the digest of this tree's sources that a pass names it by, and exit
# One install step: the wheels into $site/wheels, this tree into $site/after and --before's into
# $site/before ($site=/tmp/sok1x-pass); the stages run from /tmp, so the installed package is the
# one imported. Logs and JSON go to a work folder; $OUT (default /tmp/sok1x-pass-out) gets
# summary.txt, log.txt, the work folder's *.md and *.png, and pass.tgz (the whole work folder).
#
# Stages (a stage may take arguments after "=", comma-separated):
#   micro        rows.py (gather / scatter-add vs copy, a candidate rows.cu beside it:
#                $SOK1X_ROWS_CANDIDATE, $SOK1X_ROWS_LABEL), hash_table.py and dynamic_table.py
#   hybrid       host_rows.py (mapped host-row rates per way and region size) and
#                dynamic_breakdown.py (where one find_or_insert call's time goes)
#   profile      Nsight Compute over profile_kernels.py (SpeedOfLight, Occupancy) -> ncu.txt
#   kernels[=W,...]  step_kernels.py under Nsight Compute: each kernel of a one-rank bounded step
#                of each workload (default dlrm, seed, dlrm26; one ncu process each), its time
#                and DRAM bytes -> kernels.txt ($SOK1X_KERNELS_ARGS: more arguments, e.g.
#                "--replayed --warmup 30")
#   kernel-detail[=W]  Nsight Compute's speed of light, memory, warp stall and occupancy sections
#                for the kernels of one replayed step of W (default dlrm) whose names match
#                $SOK1X_DETAIL_KERNELS (default update_lazy|take_rows|place_by|count_seg|scan_)
#                -> kernel_detail.txt
#   calls[=W,...]  step_calls.py --replayed on cuda at full scale (default dlrm, dlrm26): the
#                replayed step's Python calls, its wall time, and host_us (the step with its
#                graphs not launched); the cProfile by own and cumulative time ->
#                calls-stats-TREE-W.txt (a process a workload); with --before, both trees
#                alternated twice
#   critical[=W,...]  critical_path.py on cuda at full scale (default dlrm26_full, dlrm26): the
#                replayed step's host path from its wait's wake to the next forward's launch,
#                part by part (a process a workload); with --before, both trees alternated twice
#   host-ab[=W,...]  host_work.py (a replayed step with its recorded works held back: the host's
#                own work) of both trees (--before), each workload (default dlrm26_hash,
#                dlrm26_hybrid) and tree a process a round on core $PASS_CORE (default 5),
#                $PASS_ROUNDS rounds (default 8) interleaved, compared as distributions
#                -> host_ab.txt (the host's pace moves 1.5-2x between processes: NOTES)
#   driver-calls[=W,...]  driver_calls.py: microseconds a CUDA driver call costs the host here
#                (launch, copies, events, graph launch, context push), and the driver calls of a
#                replayed step of each workload (default dlrm, dlrm26, dlrm26_hash,
#                dlrm26_hybrid) with its host_us -> driver_calls.json
#   call-cost    kernel_call_cost.py on cuda: a kernel call's own host work a call (three ops
#                whose engine functions do nothing) and its Python calls; with --before, both
#                trees alternated twice
#   steps1       step_and_exchange.py on 1 GPU;  steps: on 1, 2 and 4 GPUs (as many as there are)
#   group        group_lookup.py (one fused lookup of 26 tables vs 26 lookups) on 1 to 8 GPUs
#   framework[=W,...]  framework_step.py on 1, 2, 4, 8 GPUs (up to the machine's), each workload
#                named (else $SOK1X_FRAMEWORK_WORKLOADS, default every workload: seed, dlrm,
#                dlrm26, dlrm26_hash, dlrm26_dynamic, dlrm26_hybrid, dlrm26_split, dlrm26_full, and
#                mlperf26,
#                which skips itself below four H200s) in a process of its own, the variants
#                $SOK1X_BENCH_VARIANTS names (default sok1x_replayed, sok1x_kernels_replayed,
#                torch_dedup, torch_graph: every one at once does not fit one H200; set it
#                empty for all)
#                ($SOK1X_FRAMEWORK_LIMIT_S each, default 240; $SOK1X_FRAMEWORK_ARGS: more
#                arguments, e.g. "--repeats 11"), then framework_report.py ->
#                framework.{json,md,png}
#   checkpoint   checkpoint_io.py: dump + load of 10M x 128 rows on 1 and 4 GPUs beside plain disk
#                I/O ($SOK1X_CKPT_DIR, default /tmp/sok1x-ckpt-io), then 1M rows on cuda and cpu,
#                whose value digests must agree
#   kernel-tests the GPU tests of the kernels bench/ may change (cuda backend, NCCL, engine)
#   suites[=A,B] run_all.sh's suites at 1 GPU (default $PASS_SUITES, else the table, hash,
#                ordering, engine, seam and group suites)
#   grid         dynamic_table.py at dims $PASS_DIMS (default 64), hbm and 1/4, 1/2, 3/4 host,
#                loads 0.5 and 0.75, HierarchicalKV beside it (--hkv) -> grid.md (2^24 rows and
#                7 repeats, or $PASS_GRID_ROWS_LOG2 and $PASS_GRID_REPEATS; the host shares
#                of $PASS_GRID_SHARES, the loads of $PASS_GRID_LOADS: 1.0 for hybrid only;
#                $PASS_GRID_ARGS: more arguments, e.g. "--region-sweep 8192,256")
#   grid-ab      dynamic_table.py, load 0.5, hbm, 1/2 and 3/4 host: before, after, twice
#   breakdown-ab dynamic_breakdown.py of both trees at hbm and at 3/4 host
#   framework-ab framework_step.py at $PASS_RANKS GPUs (default 1), $PASS_WORKLOADS (default seed
#                dlrm dlrm26), before, after, twice, each tree timed by its own script
#                ($PASS_SCALE divides batch and vocabulary, default 1)
#   growth-ab    growth_step.py of both trees, $PASS_ROUNDS rounds (default 2) of before, after
#                ($PASS_GROWTH_ARGS: more arguments both trees' growth_step know, e.g.
#                "--ways room,evict_drop")
#   parts-ab     full_table_parts.py (a full hybrid table alone, 2^26 rows, its evicting call's
#                pieces and eviction kernels) of both trees, $PASS_ROUNDS rounds of before, after
#                ($PASS_PARTS_ARGS: its arguments, default "--share 0.25 --evicted drop --kernels")
#   growth-profile  a cProfile of this tree's growth_step ways -> growth-profile.txt
#   growth-kernels-ab  growth_kernels.py (this checkout's) over both trees, $PASS_ROUNDS rounds
#                of before, after: the warm steps' wall, host time and kernels (PyTorch's
#                profiler) way by way, room, evict_drop, evict_device
#   new-rows     new_rows_init.py: a full group's new rows' vectors and slots, in one launch, in
#                three, and at fewer threads a row -> new_rows_init.json
#   gather-grid  gather_grid.py: dlrm's forward gather, this tree's kernel beside (--before) that
#                tree's, each checked against NumPy
#   update-grid  update_grid.py: dlrm's LazyAdam update, this tree's kernel beside it at other
#                register caps ($PASS_MIN_BLOCKS, default 1,8) and (--before) that tree's, each
#                checked bit for bit; the stamp alone beside it
#   growth-this  growth_step.py of this tree, $PASS_ROUNDS rounds (default 2), $PASS_GROWTH_ARGS
#   host-slices  host_slices.py: one page-locked block against 128 MiB slices (1, 2, 4 GiB)
#   hkv-grid     hbm engine path of before, this tree's grid with HierarchicalKV at dim 64
#                (--hkv) -> grid.md, before again
#   find-or-insert-ab  dynamic_table.py (hbm, then hbm and 1/2 host) and hash_table.py of both
#                trees alternated, timed by this checkout's scripts, then this tree's breakdown
#   ncu-find-or-insert  Nsight Compute over the one hash_find_or_insert_values kernel
#   host-way     host_rows.py; exports SOK1X_HOST_ROWS = the fastest way at the largest region
#                whose CPU view agreed with the kernels (for the stages after it)
#   dynamic-tests  tests/gpu/test_dynamic_cuda.py at 1 GPU (-x)
#   breakdown    dynamic_breakdown.py of this tree, dim 64
#   dynamic-ab   dynamic_table.py of both trees (each its own script), dims 64 and 128, hbm and 1/2
#   backend-tests  test_cuda_backend.py and test_bounded_waits.py (vmm cases only when host-way
#                chose vmm)
#   hash-ab      hash_table.py of both trees (each its own script), dim 64
#   ckpt-tests   the checkpoint tests on cuda at 1 rank (both load ways)
#   ckpt-stages  checkpoint_stages.py: where a dump and a load of $CKPT_STAGES_ROWS (2M) x 128 rows
#                spend their time ($CKPT_STAGES_REPEATS 3, $CKPT_STAGES_LIMIT 60 s)
#   ckpt-before  (with --before; skipped without) the stage probe of its sok1x, then its own
#                checkpoint_io.py at 10M rows
#   ckpt-bench   checkpoint_io.py: dump + load of 10M x 128 rows in /dev/shm, 5 repeats
#   ckpt-big     ($CKPT_BIG_ROWS=N) the same for N rows, $CKPT_BIG_REPEATS (5), bounded by
#                $CKPT_BIG_LIMIT (240 s); each round printed as it ends
#                (the ckpt-* stages run unbound: $CKPT_BIND, default none)
# Presets (the passes that had scripts of their own):
#   gpu          micro steps profile            ckpt      ckpt-tests ckpt-stages ckpt-before
#                                                         ckpt-bench ckpt-big
#   growth       suites=dynamic-1gpu,table-groups-1gpu growth-ab growth-profile
#   hkv          suites=hash-values,dynamic-1gpu,cuda-backend host-slices hkv-grid
#   find-or-insert  find-or-insert-ab suites=hash-values,dynamic-1gpu,cuda-backend,engine-1gpu
#                ncu-find-or-insert
#   dynamic-before-after  host-way dynamic-tests breakdown dynamic-ab backend-tests hash-ab
#   host-seam    suites=host-seam-1gpu framework=dlrm,dlrm26 (TensorFlow 1.15's host-staging step
#                beside the device step: framework_step.py's sok1x_host* variants)
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
tree_digest() {  # the first 10 hex digits of sha1 over the sources (their paths and bytes)
  (cd "$here" && find sok1x cuda_kernels bench -type f \( -name '*.py' -o -name '*.cu' \
    -o -name '*.cuh' -o -name '*.c' -o -name '*.sh' \) -not -path 'bench/results/*' \
    | LC_ALL=C sort | while read -r f; do printf '%s\n' "$f"; cat "$f"; done | sha1sum \
    | cut -c1-10)
}
usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
before= hkv= hkv_src= compile=1
wheels=${SOK1X_BENCH_WHEELS:+$here/$SOK1X_BENCH_WHEELS}
limit=${PASS_LIMIT_S:-560}
stages=()
while [ $# -gt 0 ]; do
  case $1 in
    --before) before=$(cd "${2:?--before needs a folder}" && pwd) || exit 2; shift ;;
    --hkv) hkv=$(readlink -f "${2:?--hkv needs a binary}"); shift ;;
    --hkv-src) hkv_src=$(cd "${2:?--hkv-src needs a folder}" && pwd) || exit 2; shift ;;
    --wheels) wheels=$(cd "${2:?--wheels needs a folder}" && pwd) || exit 2; shift ;;
    --limit) limit=${2:?--limit needs seconds}; shift ;;
    --no-compile) compile= ;;
    --digest) tree_digest; exit 0 ;;
    --list) sed -n '/^# Stages/,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    -h|--help) usage 0 ;;
    -*) echo "pass.sh: unknown option $1" >&2; usage ;;
    gpu) stages+=(micro steps profile) ;;
    ckpt) stages+=(ckpt-tests ckpt-stages ckpt-before ckpt-bench ckpt-big) ;;
    growth) stages+=(suites=dynamic-1gpu,table-groups-1gpu growth-ab growth-profile) ;;
    hkv) stages+=(suites=hash-values,dynamic-1gpu,cuda-backend host-slices hkv-grid) ;;
    find-or-insert) stages+=(find-or-insert-ab
      suites=hash-values,dynamic-1gpu,cuda-backend,engine-1gpu ncu-find-or-insert) ;;
    dynamic-before-after) stages+=(host-way dynamic-tests breakdown dynamic-ab backend-tests
      hash-ab) ;;
    host-seam) stages+=(suites=host-seam-1gpu framework=dlrm,dlrm26) ;;
    *) stages+=("$1") ;;
  esac
  shift
done
[ ${#stages[@]} -gt 0 ] || { echo "pass.sh: name at least one stage (--list)" >&2; usage; }
known=" micro hybrid profile kernels kernel-detail calls critical call-cost driver-calls host-ab steps1 steps group framework checkpoint kernel-tests suites grid
  grid-ab breakdown-ab framework-ab new-rows gather-grid update-grid growth-this growth-ab parts-ab growth-profile host-slices hkv-grid
  find-or-insert-ab ncu-find-or-insert host-way dynamic-tests breakdown dynamic-ab backend-tests
  hash-ab ckpt-tests ckpt-stages ckpt-before ckpt-bench ckpt-big "
for stage in "${stages[@]}"; do  # every name checked before anything is installed
  case $known in *[[:space:]]"${stage%%=*}"[[:space:]]*) ;;
    *) echo "pass.sh: unknown stage ${stage%%=*} (bash bench/pass.sh --list)" >&2; exit 2 ;;
  esac
  case ${stage%%=*} in
    *-ab) [ -n "$before" ] || { echo "pass.sh: $stage needs --before TREE" >&2; exit 2; } ;;
    grid|hkv-grid) [ -n "$hkv" ] || { echo "pass.sh: $stage needs --hkv BINARY" >&2; exit 2; } ;;
  esac
done

final=${OUT:-/tmp/sok1x-pass-out}; work=/tmp/sok1x-pass-work; site=/tmp/sok1x-pass
rm -rf "$work"; mkdir -p "$final" "$work"
log=$work/log.txt; summary=$final/summary.txt
trap 'cp "$log" "$work"/*.md "$work"/*.png "$final"/ 2>/dev/null
      tar -czf "$final/pass.tgz" -C "$work" .' EXIT
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export SOK1X_KERNEL_CACHE_DIR=${SOK1X_KERNEL_CACHE_DIR:-/tmp/sok1x-kernels}
say() { echo "[$SECONDS s] $*" | tee -a "$log" >>"$summary"; }
left() { local l=$((limit - SECONDS)); [ $l -gt 5 ] && echo $l || echo 5; }
bound() { local l; l=$(left); [ "$1" -lt "$l" ] && echo "$1" || echo "$l"; }
run() {  # name, seconds, command...: the command's output in NAME.log, its tail on stdout
  local name=$1 cap; cap=$(bound "$2"); shift 2
  local start=$SECONDS
  timeout -k 5 "$cap" "$@" >"$work/$name.log" 2>&1
  local rc=$?
  say "$name rc=$rc $((SECONDS - start)) s"
  grep -vE '^\s*$' "$work/$name.log" | tail -n 25
  return $rc
}
path_of() {  # tree: its PYTHONPATH
  echo "$site/$1:$site/wheels"
}
bench() {  # tree, script, name, arguments...: this checkout's script over TREE's sok1x
  local tree=$1 script=$2 name=$3; shift 3
  PYTHONPATH=$(path_of "$tree"):$here/bench run "$name" 900 python3 "$here/bench/$script" \
    --out "$work/$name.json" "$@"
  grep -hE 'share|load|mapped|GiB|ms/step|Error' "$work/$name.log" | head -20 >>"$summary"
}
bench_own() {  # tree, script, name, arguments...: TREE's own script over its own sok1x
  local tree=$1 script=$2 name=$3 scripts=$here/bench; shift 3
  [ "$tree" = before ] && scripts=$before/bench
  PYTHONPATH=$(path_of "$tree"):$scripts run "$name" 900 python3 "$scripts/$script" \
    --out "$work/$name.json" "$@"
  grep -hE 'share|load|mapped|GiB|ms/step|host waits|Error' "$work/$name.log" | head -20 \
    >>"$summary"
}
suites() {  # space-separated run_all.sh suites at 1 GPU, log folder name
  SOK1X_SUITES=$1 SOK1X_SUITE_TIMEOUT_S=$(left) OUT=$work/$2 run "$2" 900 \
    bash "$here/tests/gpu/run_all.sh" 1
  grep -hE '^==' "$work/$2.log" >>"$summary"
  grep -hE '^(FAILED|ERROR)' "$work/$2"/*.log 2>/dev/null | head -12 >>"$summary"
}
test_at() {  # name, seconds, ranks (or "serial"), pytest arguments...: this checkout's tests
  local name=$1 cap=$2 ranks=$3 launch=(); shift 3
  [ "$ranks" = serial ] || launch=(mpiexec ${mpi_bind:-} -n "$ranks")
  PYTHONPATH=$(path_of after) run "$name" "$cap" "${launch[@]}" python3 -m pytest -q \
    -p no:cacheprovider --color=no "$@"
}

# The stages: stage_NAME ARGUMENTS (the words after "=").
# framework_step.py's variants in the framework and framework-ab stages (all of them at once do
# not fit one H200's memory)
framework_variants=${SOK1X_BENCH_VARIANTS-sok1x_replayed,sok1x_kernels_replayed,torch_dedup,torch_graph}
stage_update_grid() {  # with --before, its optimizers.cu timed beside this tree's
  bench after update_grid.py update_grid --min-blocks "${PASS_MIN_BLOCKS:-1,8}" \
    ${before:+--baseline "$before/cuda_kernels/optimizers.cu"}
}
stage_gather_grid() {  # with --before, its rows.cu timed beside this tree's
  bench after gather_grid.py gather_grid ${before:+--baseline "$before/cuda_kernels/rows.cu"}
}
stage_new_rows() {
  bench after new_rows_init.py new_rows_init --out "$work/new_rows_init.json"
}
stage_micro() {
  local candidate=$here/${SOK1X_ROWS_CANDIDATE:-bench/kernels/rows_candidate.cu}
  bench after rows.py rows --candidate "$candidate" \
    --candidate-label "${SOK1X_ROWS_LABEL:-candidate}"
  bench after hash_table.py hash
  bench after dynamic_table.py dynamic
}
stage_hybrid() {
  bench after host_rows.py host_rows
  bench after dynamic_breakdown.py breakdown
}
ncu_path() {
  command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null \
    | head -1
}
stage_profile() {
  local candidate=$here/${SOK1X_ROWS_CANDIDATE:-bench/kernels/rows_candidate.cu}
  PYTHONPATH=$(path_of after):$here/bench run profile 90 "$(ncu_path)" --clock-control none \
    --section SpeedOfLight --section Occupancy --section LaunchStats \
    -k regex:'take_rows|add_rows|hash_|unique_claim|owner_|update_lazy' \
    python3 "$here/bench/profile_kernels.py" --candidate "$candidate"
  cp "$work/profile.log" "$work/ncu.txt"
  say "profile: $(grep -c 'Duration' "$work/ncu.txt") kernels"
}
stage_kernels() {  # [workload ...]: step_kernels.py's table of a bounded step's kernels
  # One ncu process a workload: the table cuts a log into steps, and workloads launch different
  # numbers of kernels a step.
  local w
  : >"$work/kernels.txt"
  for w in ${*:-dlrm seed dlrm26}; do
    if ! PYTHONPATH=$(path_of after):$here/bench run "kernels_$w" 150 "$(ncu_path)" \
        --clock-control none --profile-from-start off --csv --page raw \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
        python3 "$here/bench/step_kernels.py" --workloads "$w" --steps 2 ${SOK1X_KERNELS_ARGS:-} \
        >/dev/null; then
      say "kernels_$w failed: no table (its log: kernels_$w.log in pass.tgz)"
      continue
    fi
    PYTHONPATH=$(path_of after):$here/bench python3 "$here/bench/step_kernels.py" \
      --summarize "$work/kernels_$w.log" --workloads "$w" --steps 2 >>"$work/kernels.txt"
  done
  cat "$work/kernels.txt" >>"$summary"
}
stage_kernel_detail() {  # [workload]: where the named kernels of one replayed step wait
  local w=${1:-dlrm}
  PYTHONPATH=$(path_of after):$here/bench run kernel_detail 150 "$(ncu_path)" \
    --clock-control none --profile-from-start off \
    -k regex:"${SOK1X_DETAIL_KERNELS:-update_lazy|take_rows|place_by|count_seg|scan_}" \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section Occupancy --section LaunchStats \
    python3 "$here/bench/step_kernels.py" --workloads "$w" --steps 1 --replayed --warmup 30 \
    >/dev/null || say "kernel_detail failed (its log: kernel_detail.log in pass.tgz)"
  cp "$work/kernel_detail.log" "$work/kernel_detail.txt" 2>/dev/null
  say "kernel-detail $w: $(grep -c 'Duration' "$work/kernel_detail.txt" 2>/dev/null) kernels"
}
tree_rounds() {  # function, workload...: `function TREE ROUND WORKLOAD` for each workload of
  # this tree ("after"), or with --before of both trees alternated, in two rounds
  local run=$1 w tree round trees=after
  shift
  [ -n "$before" ] && trees="before after"
  for round in 1 2; do
    for tree in $trees; do
      for w in "$@"; do
        "$run" "$tree" "$round" "$w"
      done
    done
    [ -n "$before" ] || break
  done
}
calls_of() {  # tree, round, workload
  bench $1 step_calls.py "calls_$1_$2_$3" --backend cuda --scale 1 --replayed --workloads "$3" \
    --stats "$work/calls-stats-$1-$3.txt"
  say "calls $1 $2 $3:"
  grep -hE 'host_us|calls/step' "$work/calls_$1_$2_$3.log" >>"$summary"
}
stage_calls() {  # [workload ...]: the replayed step's host work on cuda, each workload in a
  # process of its own (one GPU does not hold every workload's tables at once); with --before:
  # both trees, alternated twice, each under this checkout's script
  tree_rounds calls_of ${*:-dlrm dlrm26}
  cp "$work"/calls-stats-*.txt "$final/" 2>/dev/null
}
host_of() {  # tree, round, workload: host_work.py in a process of its own, on core $PASS_CORE
  local pin=()
  command -v taskset >/dev/null && pin=(taskset -c "${PASS_CORE:-5}")
  PYTHONPATH=$(path_of "$1"):$here/bench run "host_$1_$2_$3" 300 "${pin[@]}" python3 \
    "$here/bench/host_work.py" --out "$work/host_$1_$2_$3.json" --tree "$1" --workloads "$3"
  grep -h 'host_us' "$work/host_$1_$2_$3.log" >>"$summary"
}
stage_host_ab() {  # [workload ...]: a replayed step's own host work (host_work.py) of both
  # trees, each workload and tree a process a round, $PASS_ROUNDS rounds (default 8)
  # interleaved, then the processes compared as distributions
  local round tree w rounds=${PASS_ROUNDS:-8}
  for round in $(seq -w 1 "$rounds"); do
    for tree in before after; do
      for w in ${*:-dlrm26_hash dlrm26_hybrid}; do
        host_of "$tree" "$round" "$w"
      done
    done
  done
  python3 "$here/bench/host_work.py" --summarize "$work"/host_before_*.json \
    "$work"/host_after_*.json 2>&1 | tee "$work/host_ab.txt" >>"$summary"
}
stage_driver_calls() {  # [workload ...]: driver_calls.py of this tree: what one driver call
  # costs the host, and how many a replayed step of each workload makes
  # (part 1 alone, then a process a workload: one GPU holds one workload's tables at a time)
  local w
  bench after driver_calls.py driver_calls --workloads ""
  grep -hE '^  |pace' "$work/driver_calls.log" >>"$summary"
  for w in ${*:-dlrm dlrm26 dlrm26_hash dlrm26_hybrid}; do
    bench after driver_calls.py "driver_calls_$w" --workloads "$w" \
      --costs "$work/driver_calls.json"
    grep -hE 'host_us|pace' "$work/driver_calls_$w.log" >>"$summary"
  done
  tar czf "$final/driver_calls.tgz" -C "$work" $(cd "$work" && ls driver_calls*.json) 2>/dev/null
}
critical_of() {  # tree, round, workload
  bench $1 critical_path.py "critical_$1_$2_$3" --backend cuda --scale 1 --workloads "$3"
  say "critical $1 $2 $3:"
  grep -hE ' us$|host path' "$work/critical_$1_$2_$3.log" >>"$summary"
}
call_cost_of() {  # tree, round, (unused)
  bench $1 kernel_call_cost.py "call_cost_$1_$2" --backend cuda --repeats 7 --calls 3000
  say "call cost $1 $2:"
  grep -hE 'GPU op' "$work/call_cost_$1_$2.log" >>"$summary"
}
stage_call_cost() {  # a kernel call's own host work (kernel_call_cost.py); with --before: both
  # trees, alternated twice, each under this checkout's script
  tree_rounds call_cost_of -
}
stage_critical() {  # [workload ...]: the host's path from a replayed step's wake to the next
  # launch, each workload in a process of its own; with --before: both trees, alternated twice,
  # each under this checkout's script
  tree_rounds critical_of ${*:-dlrm26_full dlrm26}
}
stage_steps1() {
  PYTHONPATH=$PYTHONPATH:$here/bench run steps-1 130 mpiexec -n 1 python3 \
    "$here/bench/step_and_exchange.py" --out "$work/w1.json"
}
stage_steps() {
  local n
  for n in 1 2 4; do
    [ "$n" -le "$gpus" ] || continue
    PYTHONPATH=$PYTHONPATH:$here/bench run "steps-$n" 90 mpiexec -n "$n" python3 \
      "$here/bench/step_and_exchange.py" --out "$work/w$n.json"
  done
}
stage_group() {
  local n
  for n in 1 2 4 8; do
    [ "$n" -le "$gpus" ] || continue
    PYTHONPATH=$PYTHONPATH:$here/bench run "group-$n" 120 mpiexec -n "$n" python3 \
      "$here/bench/group_lookup.py" --out "$work/group$n.json"
  done
}
stage_framework() {
  # Each workload in a process of its own: what one leaves in the GPU's memory pools cannot
  # crowd the next out (at 1 GPU, seed then dlrm did not fit one H200 together).
  local all=seed,dlrm,dlrm26,dlrm26_hash,dlrm26_dynamic,dlrm26_hybrid,dlrm26_split,dlrm26_full,mlperf26
  # Every variant at once does not fit one H200 from dlrm up (the host seam's first-steps
  # check ran out of memory, 2026-11-28): the default names those the reports read;
  # SOK1X_BENCH_VARIANTS= (set and empty) runs every one.
  local variants=$framework_variants
  local n w files=() workloads=${*:-${SOK1X_FRAMEWORK_WORKLOADS:-$all}}
  for n in 1 2 4 8; do
    [ "$n" -le "$gpus" ] || continue
    for w in ${workloads//,/ }; do
      SOK1X_BENCH_VARIANTS=$variants PYTHONPATH=$PYTHONPATH:$here/bench run "framework-$n-$w" \
        "${SOK1X_FRAMEWORK_LIMIT_S:-240}" mpiexec -n "$n" python3 \
        "$here/bench/framework_step.py" --out "$work/fw$n-$w.json" --workloads "$w" \
        ${SOK1X_FRAMEWORK_ARGS:-}
      [ -s "$work/fw$n-$w.json" ] && files+=("$work/fw$n-$w.json")  # (one cut short: none)
    done
  done
  PYTHONPATH=$PYTHONPATH:$here/bench run framework-report 60 python3 \
    "$here/bench/framework_report.py" --name framework --out "$work" "${files[@]}"
  cp "$work"/framework.json "$final"/ 2>/dev/null
}
stage_checkpoint() {
  local n backend dir=${SOK1X_CKPT_DIR:-/tmp/sok1x-ckpt-io}
  for n in 1 4; do  # unbound: Open MPI gives 1 or 2 ranks one core each, too few for I/O threads
    [ "$n" -le "$gpus" ] || continue
    PYTHONPATH=$PYTHONPATH:$here/bench run "checkpoint-$n" 500 mpiexec --bind-to none -n "$n" \
      python3 "$here/bench/checkpoint_io.py" --backend cuda --dir "$dir" --repeats 2 \
      --out "$work/checkpoint$n.json"
  done
  for backend in cuda cpu; do
    PYTHONPATH=$PYTHONPATH:$here/bench run "checkpoint-digest-$backend" 300 mpiexec \
      --bind-to none -n 1 python3 "$here/bench/checkpoint_io.py" --backend "$backend" \
      --rows 1000000 --dir "$dir" --repeats 1 --digest --out "$work/checkpoint-digest-$backend.json"
  done
  say "checkpoint digests: $(grep -h values_digest "$work"/checkpoint-digest-*.json | sort -u \
    | wc -l) distinct (1 = cuda equals cpu)"
  rm -rf "$dir"
}
stage_kernel_tests() {
  local n
  test_at test-backend 120 serial "$here/tests/gpu/test_cuda_backend.py"
  for n in 2 4; do
    [ "$n" -le "$gpus" ] || continue
    test_at "test-nccl-$n" 90 "$n" "$here/tests/gpu/test_nccl_collectives.py"
  done
  test_at test-engine 90 "$gpus" "$here/tests/gpu/test_engine_cuda.py"
}
suite_count=0
stage_suites() {
  suite_count=$((suite_count + 1))
  local names="$*" usual="hash-values host-order dynamic-1gpu cuda-backend engine-1gpu seam-1gpu"
  usual="$usual table-groups-1gpu v2-engine-1gpu"
  suites "${names:-${PASS_SUITES:-$usual}}" "suites$suite_count"
}
grid_args() { echo "--rows-log2 ${PASS_GRID_ROWS_LOG2:-24} --repeats ${PASS_GRID_REPEATS:-7}"; }
stage_grid() {
  bench after dynamic_table.py grid $(grid_args) --dims "${PASS_DIMS:-64}" \
    --loads "${PASS_GRID_LOADS:-0.5,0.75}" \
    --shares "${PASS_GRID_SHARES:-0,0.25,0.5,0.75}" --hkv "$hkv" --markdown "$work/grid.md" \
    ${PASS_GRID_ARGS:-}
}
stage_grid_ab() {
  local round tree
  for round in 1 2; do
    for tree in before after; do
      bench $tree dynamic_table.py "grid_${tree}_$round" $(grid_args) --dims "${PASS_DIMS:-64}" \
        --loads 0.5 --shares 0,0.5,0.75
    done
  done
}
stage_breakdown_ab() {
  local share tree
  for share in 0 0.75; do
    for tree in before after; do
      bench $tree dynamic_breakdown.py "breakdown_${tree}_$share" --dim 64 --share $share
    done
  done
}
stage_framework_ab() {  # each tree timed by its own framework_step.py, framework's variants
  local round tree workload
  for round in 1 2; do
    for tree in before after; do
      for workload in ${PASS_WORKLOADS:-seed dlrm dlrm26}; do
        ranks=${PASS_RANKS:-1} SOK1X_BENCH_VARIANTS=$framework_variants mpi_bench_own $tree \
          framework_step.py "fw_${tree}_${workload}_$round" --workloads "$workload" \
          --scale "${PASS_SCALE:-1}"
      done
    done
  done
}
mpi_bench_own() {  # bench_own under mpiexec -n $ranks (default 1)
  local tree=$1 script=$2 name=$3 scripts=$here/bench; shift 3
  [ "$tree" = before ] && scripts=$before/bench
  PYTHONPATH=$(path_of "$tree"):$scripts run "$name" 900 mpiexec -n "${ranks:-1}" python3 \
    "$scripts/$script" --out "$work/$name.json" "$@"
  grep -hE 'ms/step|host waits|launches|Error' "$work/$name.log" | tr -s ' ' | head -20 \
    >>"$summary"
}
stage_growth_this() {
  local round
  for round in $(seq "${PASS_ROUNDS:-2}"); do
    bench after growth_step.py "growth_after_$round" ${PASS_GROWTH_ARGS:-}
    grep -hE "rank\(s\)|room:|more than" "$work/growth_after_$round.log" >>"$summary"
  done
}
stage_growth_ab() {
  local round tree
  for round in $(seq "${PASS_ROUNDS:-2}"); do
    for tree in before after; do
      bench $tree growth_step.py "growth_${tree}_$round" ${PASS_GROWTH_ARGS:-}
    done
  done
}
stage_parts_ab() {  # a full table alone, piece by piece: this checkout's script over each tree
  local round tree
  for round in $(seq "${PASS_ROUNDS:-2}"); do
    for tree in before after; do
      bench $tree full_table_parts.py "parts_${tree}_$round" \
        ${PASS_PARTS_ARGS:---share 0.25 --evicted drop --kernels}
      grep -hE "kernel pick" "$work/parts_${tree}_$round.log" >>"$summary"
    done
  done
}
stage_growth_kernels_ab() {
  local round tree
  for round in $(seq "${PASS_ROUNDS:-2}"); do
    for tree in before after; do
      bench $tree growth_kernels.py "growth_kernels_${tree}_$round" --repeats 5
      grep -hE "wall|evict_pick|/ room" "$work/growth_kernels_${tree}_$round.log" | head -8 \
        >>"$summary"
    done
  done
}
stage_growth_profile() {
  SOK1X_BENCH_PROFILE=$work/growth-profile.txt bench after growth_step.py growth_profiled \
    --repeats 1
}
stage_host_slices() { bench after host_slices.py host_slices --sizes-gib 1,2,4; }
hkv_runs() {  # the HierarchicalKV binary, built again here from --hkv-src when it does not run
  "$hkv" >/dev/null 2>&1
  local rc=$?
  if [ $rc != 2 ] && [ -n "$hkv_src" ]; then  # 2: its usage message, so it runs here
    say "the HKV binary does not run here (rc $rc): building it again"
    hkv=$work/hkv_grid
    bash "$here/bench/hkv_build.sh" "$hkv_src" "$hkv" >>"$log" 2>&1
  fi
}
stage_hkv_grid() {
  hkv_runs
  bench before dynamic_table.py engine_before_1 $(grid_args) --dims 64,128 --loads 0.5 --shares 0
  bench after dynamic_table.py grid $(grid_args) --hkv "$hkv" --hkv-dims 64 \
    --markdown "$work/grid.md"
  bench before dynamic_table.py engine_before_2 $(grid_args) --dims 64,128 --loads 0.5 --shares 0
}
stage_find_or_insert_ab() {
  # Alternated processes: a slow first case of a fresh process then hits both trees alike.
  local round tree shares
  for round in 1 2; do
    shares=0; [ $round = 2 ] && shares=0,0.5
    for tree in before after; do
      bench $tree dynamic_table.py "dynamic_${tree}_$round" --rows-log2 24 --dims 64,128 \
        --loads 0.5 --shares $shares --repeats 7
    done
  done
  for tree in before after; do
    bench $tree hash_table.py "hash_$tree" --dims 64 --repeats 7
  done
  bench after dynamic_breakdown.py breakdown_after --dim 64
}
stage_ncu_find_or_insert() {
  [ -n "$(ncu_path)" ] || { say "no ncu here"; return; }
  PYTHONPATH=$(path_of after):$here/bench run ncu 300 "$(ncu_path)" --kernel-name \
    hash_find_or_insert_values --launch-skip 2 --launch-count 1 --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section Occupancy python3 \
    "$here/bench/dynamic_breakdown.py" --out "$work/breakdown_ncu.json" --dim 64 --repeats 1
  cp "$work/ncu.log" "$work/ncu.txt"
  local figures='Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Achieved Occupancy'
  say "ncu: $(grep -E "$figures" "$work/ncu.txt" | tr -s ' ' | tr '\n' ';')"
}
stage_host_way() {
  say "THP $(cat /sys/kernel/mm/transparent_hugepage/enabled), NUMA nodes $(ls -d \
    /sys/devices/system/node/node* 2>/dev/null | wc -l)"
  bench after host_rows.py host_rows --sizes-gib 0.25,1,4 --dims 64 --repeats 5
  SOK1X_HOST_ROWS=$(python3 - "$work/host_rows.json" <<'PY'
import json, sys
try:
    grid = json.load(open(sys.argv[1]))["grid"]
except (OSError, ValueError, KeyError):
    grid = []
ok = [e for e in grid if e["cpu_agrees"] and e["way"] == e["got"]]
big = max([e["size_gib"] for e in ok] or [0])
best = max([e for e in ok if e["size_gib"] == big], key=lambda e: e["read"]["gib_per_s"],
           default=None)
print(best["way"] if best else "pinned")
PY
)
  export SOK1X_HOST_ROWS
  say "SOK1X_HOST_ROWS=$SOK1X_HOST_ROWS"
}
stage_dynamic_tests() {
  test_at dynamic-tests 150 1 -x "$here/tests/gpu/test_dynamic_cuda.py"
}
stage_breakdown() { bench after dynamic_breakdown.py breakdown --dim 64; }
stage_dynamic_ab() {
  local tree
  for tree in before after; do
    bench_own $tree dynamic_table.py "dynamic_$tree" --rows-log2 24 --dims 64,128 --loads 0.5 \
      --shares 0,0.5 --repeats 7
  done
}
stage_backend_tests() {
  local skip=(); [ "${SOK1X_HOST_ROWS:-}" = vmm ] || skip=(-k "not vmm")
  PYTHONPATH=$(path_of after) run backend-tests 100 python3 -m pytest -q -p no:cacheprovider \
    --color=no -s "${skip[@]}" "$here/tests/gpu/test_cuda_backend.py" \
    "$here/tests/gpu/test_bounded_waits.py"
  grep -E "got (vmm|thp|pinned)|^(FAILED|ERROR)" "$work/backend-tests.log" | head -12 >>"$summary"
}
stage_hash_ab() {
  local tree
  for tree in before after; do
    bench_own $tree hash_table.py "hash_$tree" --dims 64 --repeats 7
  done
}
# Each checkpoint process may use the host's cores ($CKPT_BIND=core for the other case): Open MPI
# binds a job of one or two ranks to one core each, where the checkpoint's file and checksum
# threads share it (bench/NOTES.md: one H200, 10M rows, dump 47% and load 43% of a plain write
# and read bound, 109% and 70% unbound).
ckpt_mpi() { echo "--bind-to ${CKPT_BIND:-none}"; }
stage_ckpt_tests() {
  SOK1X_TEST_BACKEND=cuda mpi_bind=$(ckpt_mpi) test_at ckpt-tests 90 1 \
    "$here/tests/mpi/test_sharded_checkpoint.py" "$here/tests/mpi/test_checkpoint.py"
}
ckpt_io() {  # tree, name, seconds, checkpoint_io.py arguments...
  local tree=$1 name=$2 cap=$3 scripts=$here/bench; shift 3
  [ "$tree" = before ] && scripts=$before/bench
  PYTHONPATH=$(path_of "$tree") run "$name" "$cap" mpiexec $(ckpt_mpi) -n 1 python3 \
    "$scripts/checkpoint_io.py" --backend cuda --dir /dev/shm --out "$work/$name.json" "$@"
}
ckpt_stage_probe() {  # tree, name, seconds, rows, repeats
  PYTHONPATH=$(path_of "$1") run "$2" "$3" mpiexec $(ckpt_mpi) -n 1 python3 \
    "$here/bench/checkpoint_stages.py" --backend cuda --rows "$4" --dir /dev/shm --repeats "$5" \
    --out "$work/$2.json"
}
stage_ckpt_stages() {
  ckpt_stage_probe after checkpoint_stages_1gpu "${CKPT_STAGES_LIMIT:-60}" \
    "${CKPT_STAGES_ROWS:-2000000}" "${CKPT_STAGES_REPEATS:-3}"
}
stage_ckpt_before() {
  [ -n "$before" ] || { say "ckpt-before: no --before tree, skipped"; return; }
  ckpt_stage_probe before checkpoint_stages_2M_1gpu_before 60 2000000 3
  ckpt_io before checkpoint_io_10M_1gpu_before 90 --rows 10000000 --repeats 5
}
stage_ckpt_bench() {
  ckpt_io after checkpoint_io_10M_1gpu 100 --rows 10000000 --repeats 5
  rm -rf /dev/shm/sok1x-checkpoint-io /dev/shm/sok1x-checkpoint-stages
}
stage_ckpt_big() {
  [ -n "${CKPT_BIG_ROWS:-}" ] || { say "ckpt-big: set CKPT_BIG_ROWS"; return; }
  ckpt_io after checkpoint_io_big_1gpu "${CKPT_BIG_LIMIT:-240}" --rows "$CKPT_BIG_ROWS" \
    --repeats "${CKPT_BIG_REPEATS:-5}" --sample 20000
  rm -rf /dev/shm/sok1x-checkpoint-io
}

# The one install step.
# The tree is named by a digest of its sources: a device's copy of the working tree may carry
# an older .git than its files (its HEAD named 241fb8a through a day of later trees, 2026-11-28).
# The same digest of a commit here: bash bench/pass.sh --digest (in a checkout of it).
say "$(date -u) tree $(tree_digest) (git's HEAD there: $(git -C "$here" rev-parse --short HEAD \
  2>/dev/null)) stages: ${stages[*]}"
say "$(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader)"
if [ -z "$wheels" ]; then
  wheels=$here/.device-wheels; [ -d "$wheels" ] || wheels=$here/../../.device-wheels
fi
[ -e "$here/.device-wheels" ] || ln -s "$wheels" "$here/.device-wheels"  # for run_all.sh
rm -rf "$site"
python3 -m pip install -q --no-index --no-deps --target "$site/wheels" "$wheels"/*.whl \
  >>"$log" 2>&1 || { say "installing the wheels of $wheels failed"; exit 1; }
trees=after; [ -n "$before" ] && trees="after before"
for tree in $trees; do
  src=$here; [ $tree = before ] && src=$before
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --target "$site/$tree" \
    "$src" >>"$log" 2>&1 || { say "installing $tree ($src) failed"; exit 1; }
done
cd /tmp
if [ -n "$compile" ]; then
  for tree in $trees; do  # every kernel family compiled in parallel into the shared cache
    PYTHONPATH=$(path_of $tree) python3 - >>"$log" 2>&1 <<'PY' &
from concurrent.futures import ThreadPoolExecutor
import pycuda.driver as driver
from sok1x import cuda_kernels
driver.init()
arch = "sm_%d%d" % driver.Device(0).compute_capability()
names = cuda_kernels.source_names()
cuda_kernels.compile_cubin(names[0], arch)
with ThreadPoolExecutor(8) as pool:
    list(pool.map(lambda name: cuda_kernels.compile_cubin(name, arch), names[1:]))
print("compiled", len(names), "families for", arch)
PY
  done
  wait
fi
say "installed ($trees)${compile:+ and compiled}"
gpus=$(nvidia-smi -L | wc -l)
export PYTHONPATH=$(path_of after)
for stage in "${stages[@]}"; do
  arg=; case $stage in *=*) arg=${stage#*=}; arg=${arg//,/ } ;; esac
  name=${stage%%=*}
  say "== $name $arg"
  "stage_${name//-/_}" $arg
done
say "== done"
