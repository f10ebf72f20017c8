"""HierarchicalKV measured on the machine and in the run that measures sok1x (issue 21).

bench/kernels/hkv_grid.cu runs HierarchicalKV's own benchmark routine (test_one_api of its
benchmark/merlin_hashtable_benchmark.cc.cu) on one grid point; bench/hkv_build.sh builds it
against a HierarchicalKV checkout:
    bash bench/hkv_build.sh HKV_CHECKOUT /some/where/hkv_grid
    python3 bench/dynamic_table.py --hkv /some/where/hkv_grid ...
Nothing of HierarchicalKV is in sok1x: the binary is a measuring reference only.

How HierarchicalKV's routine measures (as its published tables): per repeat the table is
cleared and filled to the load with find_or_insert, then one call of 2^20 keys (60% held, 40%
not; find_or_insert inserts the 40%) is timed by the host clock around the call and its stream
synchronisation. Its hybrid table keeps vectors past max_hbm_for_vectors bytes in page-locked
mapped host memory, in whole memory slices (16 or 128 MiB here), so the host share is that of
sok1x's table to within a slice.
"""
import json
import subprocess

import harness

APIS = ("find", "find_or_insert")


def run(binary, dim, rows, host_share, loads, repeats, timeout_s=240):
    """{"%.2f" % load: {api: figures}} from one run of `binary` (one table, every load), each
    figures {gkeys_per_s (median), gkeys_per_s_min, gkeys_per_s_max, gkeys_per_s_repeats,
    hbm_bytes}; or {"error": text} when the binary fails (the sok1x figures still stand)."""
    command = [binary, str(dim), str(rows), repr(float(host_share)),
               ",".join("%.4f" % load for load in loads), str(repeats)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as error:
        return {"error": "%s: %s" % (" ".join(command), error)}
    figures = {}
    for line in done.stdout.splitlines():
        if not line.startswith("{"):
            continue
        point = json.loads(line)
        entry = harness.summary(point["gkeys_per_s"], (
            "gkeys_per_s", "gkeys_per_s_min", "gkeys_per_s_max", "gkeys_per_s_repeats"))
        entry["hbm_bytes"] = point["hbm_bytes"]
        figures.setdefault("%.2f" % point["load"], {})[point["api"]] = entry
    if done.returncode or not figures:
        figures["error"] = "%s: rc %d, %s" % (" ".join(command), done.returncode,
                                               done.stderr.strip()[-400:])
    return figures
