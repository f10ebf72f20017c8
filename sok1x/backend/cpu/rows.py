"""Row ops of the cpu backend that its HashIndex (cpu_hash.find_or_insert_values) uses too:
gather_rows, fill_rows, touch_rows, init_rows (re-exported by cpu.py as part of the op set)."""
import collections

import numpy as np

from sok1x.backend import given_hyper, random_init
from sok1x.backend.cpu.random_rows import initial_values

# What this process's steps did (cpu.counts()): "host_waits", the calls at which the cuda
# backend's host would wait for the device (cpu.py's ops and cpu_hash's).
COUNTS = collections.Counter()


def whole_rows(array):
    """The array a row op indexes: a split array's whole, or the array itself."""
    return array.whole if hasattr(array, "parts") else array


def counted_rows(rows, count):
    rows = np.asarray(rows, dtype=np.int64)
    return rows if count is None else rows[:int(np.asarray(count).reshape(-1)[0])]


def gather_rows(table, rows, fill=True):
    """Returns table[rows] with a zero vector where rows == -1, or where a row lies past the
    table (keys whose checks are read later: engine/lookup/bounded_step.py). fill=False lets
    the cuda backend leave those places unwritten; here they are zero either way."""
    table = whole_rows(table)
    rows = np.asarray(rows, dtype=np.int64)
    if rows.size == 0 or (rows.min() >= 0 and rows.max() < table.shape[0]):
        return np.take(table, rows, axis=0)
    if table.shape[0] == 0:  # every row is -1 (a shard with no rows, padded slots)
        return np.zeros((rows.shape[0],) + table.shape[1:], dtype=table.dtype)
    outside = (rows < 0) | (rows >= table.shape[0])
    out = table[np.where(outside, 0, rows)]
    out[outside] = 0
    return out


def gather_rows_many(tables, rows, fill=True):
    """[gather_rows(table, rows, fill) for table in tables] (cuda's gathers several arrays in
    one launch)."""
    return [gather_rows(table, rows, fill) for table in tables]


def init_rows_tagged(table, rows, keys, tags, spec, table_ids, count=None, slots=()):
    """init_rows of a table group's flat rows: key i initialised as a key of table table_ids[
    tags[i]] (the rows of one member at a time); slots: (array, value) pairs whose same rows
    take the constant value (cuda writes them in the same pass)."""
    rows = counted_rows(rows, count)
    keys = np.asarray(keys, dtype=np.int64)[:rows.shape[0]]
    tags = np.asarray(tags, dtype=np.int64)[:rows.shape[0]]
    for t in np.unique(tags[rows >= 0]):
        mine = tags == t
        init_rows(table, rows[mine], keys[mine], spec, int(table_ids[t]))
    for slot, value in slots:
        init_rows(slot, rows, keys, random_init.make_spec("constant", value), 0)


def fill_rows(array, rows, value, count=None):
    """array[rows] = value (inside given_hyper.time_given(clock): clock[0] now); count: None, or
    a [1] array: only the first count[0] rows, negative rows skipped (cuda's fill_rows)."""
    rows = counted_rows(rows, count)
    clock = given_hyper.given_time()
    array[rows[rows >= 0]] = value if clock is None else clock[0]


def drop_rows_if_failed(rows, flag, parts=None):
    """rows[:] = -1 where the step failed: flag[0] (its key checks) is not 0, or some count of
    parts (None, or int64 [T]) is above 0; read when called, as cuda's kernel reads them when
    it runs (a replayed update's first work)."""
    if int(flag[0]) != 0 or (parts is not None and bool((np.asarray(parts) > 0).any())):
        rows[...] = -1


def touch_rows(statistics, rows, step, stamp=None):
    """For each row >= 0: statistics[row] = (step, count + 1), statistics int64 [n, 2] records
    of (last step, count) (repeats count each time). stamp: None, or (times, new_rows, now,
    count): also fill_rows(times, new_rows, now, count) (cuda does both in one launch)."""
    rows = np.asarray(rows, dtype=np.int64)
    rows = rows[rows >= 0]
    statistics[rows, 0] = step
    # only the rows given, as cuda's kernel: a group growing in place has rows no page backs yet
    np.add.at(statistics[:, 1], rows, 1)
    if stamp is not None:
        fill_rows(*stamp)


def init_rows(table, rows, keys, spec, table_id, count=None):
    """Writes the initial vectors of `keys` (random_init's recipe) into table[rows]; count: as
    fill_rows'."""
    rows = counted_rows(rows, count)
    keys = np.asarray(keys, dtype=np.int64)[:rows.shape[0]]
    kept = rows >= 0
    if not kept.all():
        rows, keys = rows[kept], keys[kept]
    if len(rows):
        whole_rows(table)[rows] = initial_values(spec, table_id, keys, table.shape[1])
