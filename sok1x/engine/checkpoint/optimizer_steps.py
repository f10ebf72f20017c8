"""An optimizer's step state saved with the tables it trains (DESIGN D8): its step counters (a
count of steps, Adam's beta powers), so a job restarted from a dump goes on from the step it
stopped at (learning-rate schedules, bias corrections).

A record is {name: [dtype, value]} (dtype "int64", "int32", "float32" or "float64"; value a
number), one per optimizer, kept under the optimizer's name: in the sharded format in each
table's manifest entry ("optimizer_steps": {optimizer: record}), written and committed with the
rows; in SOK's format in a file beside each table's files (file_name below).
"""
import json
import os

from sok1x.errors import CheckpointError

MANIFEST_KEY = "optimizer_steps"
_DTYPES = ("int64", "int32", "float32", "float64")


def make(values):
    """The record of [(name, dtype name, number)]."""
    return {name: [dtype, int(value) if dtype.startswith("int") else float(value)]
            for name, dtype, value in values}


def _checked(record, where, expected):
    """`record` if it is one whose names are `expected` (a set); raises CheckpointError naming
    `where` otherwise."""
    try:
        names = set(record)
        for name, (dtype, value) in record.items():
            if dtype not in _DTYPES or isinstance(value, bool) or not isinstance(
                    value, (int, float)):
                raise ValueError("%s: %r" % (name, [dtype, value]))
    except (TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError("%s holds a corrupt optimizer step record (%s)" % (where, exc)
                              ) from None
    if names != set(expected):
        raise CheckpointError(
            "%s holds the step state %s of another kind of optimizer; the optimizer given keeps "
            "%s: load with the optimizer the tables were dumped with" % (
                where, sorted(names), sorted(expected)))
    return record


def agreed(found, expected):
    """The one record of [(where, record or None)] (None where none holds one); raises
    CheckpointError naming the places whose records differ, or a record whose names are not
    `expected`."""
    chosen, chosen_where = None, None
    for where, record in found:
        if record is None:
            continue
        _checked(record, where, expected)
        if chosen is None:
            chosen, chosen_where = record, where
        elif record != chosen:
            raise CheckpointError(
                "the tables to load hold different optimizer steps (%s: %s, %s: %s): they were "
                "dumped at different steps; load tables dumped together"
                % (chosen_where, chosen, where, record))
    return chosen


def of_entry(entry, optimizer):
    """The record `optimizer` left in a manifest table entry, or None."""
    return entry.get(MANIFEST_KEY, {}).get(optimizer)


def file_name(stem, optimizer):
    """SOK format: the step file of table file stem `stem` and optimizer file name
    `optimizer`, beside the table's '<stem>-<optimizer>-<slot>' files."""
    return "%s-%s-sok1x_steps.json" % (stem, optimizer)


def encode(record):
    """The bytes of a step record's file."""
    return json.dumps(record, sort_keys=True).encode("utf-8")


def read_file(path):
    """The record in file `path`, None where there is no such file; raises CheckpointError
    naming the file for one that is not a record."""
    if not os.path.exists(path):
        return None
    try:
        with open(path, "rb") as handle:
            return json.loads(handle.read().decode("utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError("%s is not an optimizer step record: %s" % (path, exc)) from None
