#!/usr/bin/env bash
# Installs everything on a fresh machine, then runs the CPU test suite in two lanes:
#   A  TensorFlow 1.15.5 on Python 3.7 (what sok1x's users run), in its own virtual environment
#      (SOK1X_VENV37, default .venv37/)
#   B  TensorFlow 2.15 on the python3 on PATH (SOK1X_VENV, default .venv/)
# Each lane runs the serial tests (lane B leaves those that run no TensorFlow to lane A, and builds
# docs/, warnings as errors), then the MPI tests as real jobs of 1, 2 and 4 ranks through sok1x's
# TensorFlow kernels, built from this checkout against the lane's TensorFlow (4 ranks, and lane B's
# 1 and 2, on the subset below), and one more job at 2 ranks on the lane's old seam, all of
# tests/mpi (A: host staging, B: zero-copy through DLPack), and prints one line of its totals and
# wall time; the last line is the total over both: `total: N passed, N failed, N skipped`. With both
# lanes, lane B's set-up runs beside lane A's one-rank MPI jobs at the lowest CPU priority, its
# output shown when lane B begins.
# No GPU needed. SOK1X_LANES picks lanes ("A B" by default; "A" or "B" runs one). Python 3.7 is
# found as scripts/setup.sh says (SOK1X_PY37, or pyenv's 3.7.16).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
lanes=${SOK1X_LANES:-A B}
export TF_CPP_MIN_LOG_LEVEL=2 PYTHONDONTWRITEBYTECODE=1
results=$(mktemp -d)
# Run from outside the repository so that Python imports the installed sok1x, not the sources.
cd "$results"
status=0
files=()
summaries=()
logs=()  # "XML:LOG" of each MPI job

# The 4-rank passes, lane A's one-rank pass with bounded steps and lane B's passes through the
# kernels run these files only (CI time: a 4-rank job on 2 cores is the slowest; the whole of
# tests/mpi at 4 ranks took 7 min in lane B): every front door (v1 layers, v2 in graph mode,
# DeepRec), the ordering of collectives, the seam and its kernels, checkpoints, and the bounded and
# replayed steps. SOK1X_RANK4=all runs the whole of tests/mpi there.
rank4_files=(test_dense_embedding.py test_sparse_embedding.py test_sok_programs.py test_v2_api.py
  test_group_embedding.py test_group_feature_columns.py test_deeprec_seed.py test_ordering.py
  test_keyed_seam.py test_seam.py test_kernel_ops.py test_sok_v1_saver.py
  test_sharded_checkpoint.py test_peer_capacity.py test_bounded_step.py
  test_replayed_step.py)

# run_job VENV SEAM RANKS CAPACITY BOUNDED XML LOG TEST...: one MPI job of pytest (seam "auto":
# sok1x chooses; CAPACITY non-empty: SOK1X_PEER_CAPACITY=1; BOUNDED non-empty:
# SOK1X_BOUNDED_STEP=1), its output shown and kept in LOG, so that a job ending without its
# results has its last lines printed again at the end (show_lost_jobs).
run_job() {
  local venv=$1 seam=$2 ranks=$3 capacity=$4 bounded=$5 xml=$6 log=$7
  shift 7
  local -a env=(PATH="$venv/bin:$PATH" PYTHONFAULTHANDLER=1 SOK1X_PEER_CAPACITY=${capacity:+1}
    SOK1X_BOUNDED_STEP=${bounded:+1})
  [ "$seam" = auto ] || env+=(SOK1X_SEAM="$seam")
  env "${env[@]}" mpiexec -n "$ranks" python -m pytest -q -p no:cacheprovider --timeout=300 \
    -rs --junitxml="$xml" "$@" 2>&1 | tee "$log"
  return "${PIPESTATUS[0]}"
}

# show_lost_jobs: for each MPI job that wrote no results, the end of its output.
show_lost_jobs() {
  local pair xml log
  for pair in "${logs[@]}"; do
    xml=${pair%%:*} log=${pair#*:}
    if [ ! -s "$xml" ]; then
      echo "== $(basename "$log" .log) ended without results; its last 60 lines:"
      tail -n 60 "$log"
    fi
  done
}

# start_setup NAME VENV SET: the lane's set-up in the background at the lowest CPU priority, its
# output kept for finish_setup. It starts with lane A's one-rank MPI jobs, which keep one core of
# two busy, so that its pip installs and Horovod's build take the other (beside lane A's serial
# tests it slowed them by half: bench/NOTES.md, 2026-11-30).
declare -A setup_pids=()
start_setup() {
  mkdir -p "$results/$1"
  nice -n 19 bash "$root/scripts/setup.sh" "$2" "$3" > "$results/$1/setup.log" 2>&1 &
  setup_pids[$1]=$!
}

# finish_setup NAME VENV SET: the lane's set-up, or the wait for the one start_setup began and
# its output; fails as the set-up failed.
finish_setup() {
  local pid=${setup_pids[$1]:-}
  if [ -z "$pid" ]; then
    bash "$root/scripts/setup.sh" "$2" "$3"
    return
  fi
  local rc=0
  wait "$pid" || rc=$?
  cat "$results/$1/setup.log"
  return "$rc"
}

# run_lane NAME VENV SET LABEL JOB...: set-up, serial tests, then one MPI job per JOB
# (seam:ranks[:subset[:capacity[:bounded]]], seam "auto" leaving the choice to sok1x; "subset":
# the 4-rank files above, not all of tests/mpi; "capacity": lookups sized by per-peer
# capacities, SOK1X_PEER_CAPACITY=1; "bounded": one-rank steps sized by their keys,
# SOK1X_BOUNDED_STEP=1), JUnit files under $results/NAME/.
run_lane() {
  local name=$1 venv=$2 set=$3 label=$4
  shift 4
  local start=$SECONDS lane_files=() job seam ranks xml log tests
  mkdir -p "$results/$name"
  echo "== lane $name ($label): set-up"
  if ! finish_setup "$name" "$venv" "$set"; then
    echo "== lane $name: set-up FAILED"
    status=1
    files+=("$results/$name/setup-failed.xml")
    summaries+=("lane $name ($label): set-up failed")
    return
  fi
  echo "== lane $name: serial tests"
  # SOK1X_TEST_LANE: lane B leaves the serial tests that run no TensorFlow to lane A
  PATH="$venv/bin:$PATH" SOK1X_TEST_LANE=$name python -m pytest -q -p no:cacheprovider \
    --timeout=600 -rs --junitxml="$results/$name/serial.xml" "$root/tests/cpu" || status=$?
  lane_files+=("$results/$name/serial.xml")
  if [ "$name" = B ]; then  # MkDocs runs on lane B's Python only: the docs, warnings as errors
    echo "== lane $name: documentation build"
    bash "$root/scripts/docs.sh" "$venv" || { echo "== documentation build FAILED"; status=1; }
  fi
  if [ -n "$ahead" ]; then  # the next lane's set-up, beside this lane's one-rank MPI jobs
    # shellcheck disable=SC2086
    start_setup $ahead
    ahead=
  fi
  for job in "$@"; do
    IFS=: read -r seam ranks subset capacity bounded <<<"$job"
    xml="$results/$name/mpi-$ranks-$seam${bounded:+-bounded}.xml"
    tests=("$root/tests/mpi")
    if [ -n "$subset" ] && [ "${SOK1X_RANK4:-}" != all ]; then
      tests=("${rank4_files[@]/#/$root/tests/mpi/}")
    fi
    echo "== lane $name: MPI tests on $ranks ranks, $seam seam${subset:+ (${#tests[@]} files)}"\
      "${capacity:+(per-peer capacities)}${bounded:+(bounded steps)}"
    log="$results/$name/mpi-$ranks-$seam${bounded:+-bounded}.log"
    run_job "$venv" "$seam" "$ranks" "$capacity" "$bounded" "$xml" "$log" "${tests[@]}" \
      || status=$?
    logs+=("$xml:$log")
    lane_files+=("$xml")
  done
  files+=("${lane_files[@]}")
  # Named one by one: a job that aborted wrote no file, and that must count as a failure.
  summaries+=("$(python3 "$root/scripts/junit_total.py" --label "lane $name ($label)" \
    "${lane_files[@]}" || true), $((SECONDS - start)) s")
}

venv_a=${SOK1X_VENV37:-$root/.venv37} venv_b=${SOK1X_VENV:-$root/.venv}
ahead=  # "NAME VENV SET" of a set-up to start once the running lane's serial tests are done
a_listed=
for lane in $lanes; do  # lane B after lane A: its set-up beside lane A's MPI jobs
  if [ "$lane" = A ]; then
    a_listed=1
  elif [ "$lane" = B ] && [ -n "$a_listed" ]; then
    ahead="B $venv_b test"
  fi
done
for lane in $lanes; do
  case $lane in
    # sok1x's kernels ("auto": built on first use), at one rank also with bounded steps
    # (SOK1X_BOUNDED_STEP=1) on the 4-rank files (every front door, the bounded and replayed
    # steps: 24-31 s, where the whole of tests/mpi took 130-270), then host staging,
    # TensorFlow 1.15's seam where the kernels cannot be built, forced.
    A) run_lane A "$venv_a" test37 "TensorFlow 1.15.5, Python 3.7" \
         auto:1 auto:1:subset::bounded auto:2 auto:4:subset host:2 ;;
    # sok1x's kernels on the 4-rank files at 1, 2 and 4 ranks (lane A runs the whole of tests/mpi
    # through them at 1 and 2 ranks; here those took 100-112 s and 155-185), then the whole of
    # tests/mpi on the zero-copy seam (DLPack: eager programs' seam, and graph mode's where the
    # kernels cannot be built), forced, with lookups sized by per-peer capacities. Host staging on
    # this TensorFlow runs where SOK1X_SEAM forces it (graph_ops/boundary.py) in the serial tests
    # that force it (test_memory_soak, the jobs mpi_jobs runs with seam "host"); SOK1X_LANE_B_HOST=1
    # adds the whole MPI suite under it at 2 ranks (about 80 s).
    B) run_lane B "$venv_b" test "TensorFlow 2.15, $(python3 -V 2>&1)" \
         auto:1:subset auto:2:subset auto:4:subset dlpack:2::capacity \
         ${SOK1X_LANE_B_HOST:+host:2} ;;
    *) echo "test.sh: unknown lane '$lane' in SOK1X_LANES (use A and/or B)" >&2; exit 2 ;;
  esac
done
show_lost_jobs
for line in "${summaries[@]}"; do
  echo "$line"
done
python3 "$root/scripts/junit_total.py" "${files[@]}" || status=1
exit "$status"
