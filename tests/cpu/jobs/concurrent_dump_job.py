"""An MPI job for test_concurrent_dumps: jobs that sok1x.dump their own tables into one folder at
the same time, round after round, and one that loads every table afterwards.

    concurrent_dump_job.py dump  <format> <folder> <tag> <start> <jobs> <rounds>   tables
        '<tag>_t0..2' (eager sok1x.Variable): once every one of the <jobs> jobs has made its
        tables (each says so by a file "ready-<tag>" in folder <start>), each round assigns
        round-made values to every row and dumps the tables into <folder> in <format> ("sok":
        sok.dump's default, SOK's files; "sharded"). Prints "DUMPED <tag>".
    concurrent_dump_job.py check <format> <folder> <rounds> <tag>...   loads every tag's tables
        from <folder> and checks them against the values of their last round; checks that
        every dump file in <folder> is one its manifest (or marker) names, and, for SOK's
        files, that SOK's reader reads the last round's values from them. Prints "CHECKED".
"""
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow  # noqa: E402,F401  (before sok1x: its eager API)
from mpi4py import MPI  # noqa: E402

import sok1x as sok  # noqa: E402
from sok1x.engine.checkpoint import sok_marker  # noqa: E402
import sok_dump_writer as sok_reader  # noqa: E402

COMM = MPI.COMM_WORLD
ROWS, DIM, TABLES = 20, 4, 3


def values_of(tag, table, round_):
    """The rows every rank assigns to table `table` of job `tag` in round `round_`."""
    base = sum(ord(c) for c in tag) * 1000.0 + table * 100.0 + round_
    return (base + np.arange(ROWS * DIM).reshape(ROWS, DIM) * 0.01).astype(np.float32)


def tables_of(tag):
    return [sok.Variable(np.zeros((ROWS, DIM), np.float32), name="%s_t%d" % (tag, t))
            for t in range(TABLES)]


def dump(file_format, folder, tag, start, jobs, rounds):
    tables = tables_of(tag)
    keys = np.arange(ROWS, dtype=np.int64)
    start_together(start, tag, int(jobs))
    for round_ in range(int(rounds)):
        for t, table in enumerate(tables):
            sok.assign(table, keys, values_of(tag, t, round_))
        sok.dump(folder, tables, file_format=None if file_format == "sok" else file_format)
    COMM.barrier()
    print("DUMPED %s" % tag, flush=True)


def start_together(start, tag, jobs, limit_s=120.0):
    """Returns once `jobs` jobs (this one included) have each put their ready file into folder
    `start`: every rank of every job starts its rounds within a few milliseconds of the others."""
    COMM.barrier()  # this job's ranks are all up
    if COMM.rank == 0:
        with open(os.path.join(start, "ready-%s" % tag), "w"):
            pass
    deadline = time.time() + limit_s
    while sum(name.startswith("ready-") for name in os.listdir(start)) < jobs:
        if time.time() > deadline:
            raise RuntimeError("%s: the other jobs were not ready within %.0f s" % (tag, limit_s))
        time.sleep(0.005)


def check(file_format, folder, rounds, *tags):
    for tag in tags:
        tables = tables_of(tag)
        sok.load(folder, tables)
        for t, table in enumerate(tables):
            keys, values = sok.export(table)
            want = values_of(tag, t, int(rounds) - 1)[np.asarray(keys)]
            np.testing.assert_array_equal(np.asarray(values), want, err_msg="%s_t%d" % (tag, t))
    if file_format == "sok":
        check_sok_files(folder, rounds, tags)
        return
    with open(os.path.join(folder, "sok1x-checkpoint.json")) as handle:
        manifest = json.load(handle)
    named = {shard["file"] for entry in manifest["tables"].values() for shard in entry["shards"]}
    dump_files = {n for n in os.listdir(folder) if n.startswith("dump-") or ".tmp-" in n}
    assert dump_files == named, ("files no manifest names", sorted(dump_files - named))
    assert len(named) == len(tags) * TABLES * COMM.size or len(tags) > 1, sorted(named)
    print("CHECKED", flush=True)


def check_sok_files(folder, rounds, tags):
    """The marker names every table's files, nothing else of a dump is left, and SOK's reader
    reads each table's last round from SOK's names."""
    with open(os.path.join(folder, sok_marker.MARKER_NAME)) as handle:
        marker = json.load(handle)
    named = {held["file"] for entry in marker["tables"].values()
             for held in entry["files"].values()}
    dump_files = {n for n in os.listdir(folder) if "-key" in n or "-weight" in n or ".tmp-" in n}
    assert dump_files == named, ("files the marker does not name", sorted(dump_files ^ named))
    for tag in tags:
        for t in range(TABLES):
            stem = "%s_t%d_0" % (tag, t)
            arrays = []
            for suffix in ("key", "weight"):
                with open(os.path.join(folder, "%s-%s" % (stem, suffix)), "rb") as handle:
                    arrays.append(sok_reader.read(handle.read())[2])
            keys = arrays[0].astype(np.int64)
            want = values_of(tag, t, int(rounds) - 1)[keys]
            np.testing.assert_array_equal(arrays[1].reshape(want.shape), want, err_msg=stem)
    print("CHECKED", flush=True)


if __name__ == "__main__":
    sok.init(backend="cpu")
    {"dump": dump, "check": check}[sys.argv[1]](*sys.argv[2:])
