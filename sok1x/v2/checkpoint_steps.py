"""sok1x.dump / sok1x.load with an optimizer carry the step state sok1x keeps for it (a
sok1x.OptimizerWrapper's twin or own step counters, sok1x/v2/wrapper_steps.py) beside the
tables (sok1x/engine/checkpoint/optimizer_steps.py): in graph mode the dump op reads the
counters as inputs and the load op assigns what the tables were dumped with; eagerly both run
at once. Another optimizer's counters are its own: the program's checkpoints hold them."""
import os

import numpy as np

from sok1x.engine import runtime
from sok1x.engine.checkpoint import optimizer_steps, sok_format, sok_marker
from sok1x.errors import CheckpointError
from sok1x.graph_ops import init_ops
from sok1x.graph_ops.tf_compat import py_func, tf1

_DONE = np.int64(0)


def applying(optimizer, variables):
    """The object that updates sok1x tables for `optimizer`: for a TF 2.11+ Keras optimizer the
    sok1x.OptimizerWrapper it keeps (made now if it has applied no step yet), else `optimizer`."""
    if optimizer is None:
        return None
    from sok1x.v2.optimizer_wrapper import is_new_keras
    if not is_new_keras(optimizer):
        return optimizer
    from sok1x.optimizers.guard import kept_wrapper
    return kept_wrapper(optimizer, variables, applying=False)


class StepState:
    """The step state [(name, variable)] of `optimizer` (after applying()) for `variables`:
    empty for None or an optimizer whose counters are its own."""

    def __init__(self, optimizer, variables):
        make = getattr(type(optimizer), "step_variables", None) if optimizer is not None else None
        self.named = list(make(optimizer, variables)) if make is not None else []

    def names(self):
        return set(name for name, _ in self.named)

    def _record(self, values):
        return optimizer_steps.make(
            [(name, variable.dtype.base_dtype.name, np.asarray(value).item())
             for (name, variable), value in zip(self.named, values)])

    def dump_op(self, write, name):
        """Runs write(record, None when there is no step state) now (eager) or returns an op
        that runs it with the counters' values at that step (graph mode)."""
        if tf1.executing_eagerly():
            write(self._record([v.numpy() for _, v in self.named]) if self.named else None)
            return None
        ensure_up = init_ops.bring_up_on_first_use()

        def run(*values):
            ensure_up()
            write(self._record(values) if self.named else None)
            return _DONE
        return py_func(run, [v.read_value() for _, v in self.named], tf1.int64, name=name).op

    def load_op(self, read, name):
        """Runs read() -> record or None (the tables loaded, the record checked) now (eager),
        then sets the counters to the record's values; or returns an op that does it (graph
        mode). Counters stay as they are where the dump held no record."""
        if tf1.executing_eagerly():
            values = self._values(read(), [v.numpy() for _, v in self.named])
            for (_, variable), value in zip(self.named, values):
                variable.assign(value)
            return None
        ensure_up = init_ops.bring_up_on_first_use()
        if not self.named:
            def run_alone():
                ensure_up()
                read()
                return _DONE
            return py_func(run_alone, [], tf1.int64, name=name).op

        def run(*current):
            ensure_up()
            return self._values(read(), current)
        dtypes = [v.dtype.base_dtype for _, v in self.named]
        loaded = py_func(run, [v.read_value() for _, v in self.named], dtypes, name=name)
        return tf1.group(*[variable.assign(tf1.reshape(value, []))
                           for (_, variable), value in zip(self.named, loaded)])

    def _values(self, record, current):
        if record is None:
            return [np.asarray(value) for value in current]
        return [np.asarray(record[name][1], dtype=variable.dtype.base_dtype.as_numpy_dtype)
                for name, variable in self.named]


def _optimizer_file_name(optimizer):
    wrapped = getattr(optimizer, "_optimizer", optimizer)
    return sok_format.optimizer_file_name(str(type(wrapped)))


def _sok_step_files(path, variables, optimizer):
    """SOK format: where each variable's table's step file is read: the one the folder's
    marker names with the table's files (sok_marker.py), else at its name."""
    name = _optimizer_file_name(optimizer)
    marker = sok_marker.read_marker(path)
    out = []
    for variable in variables:
        stem = sok_format.file_stem(variable.name)
        final = optimizer_steps.file_name(stem, name)
        entry = marker["tables"].get(stem)
        held = entry["files"].get(final) if entry is not None else None
        out.append(os.path.join(path, final if held is None else held["file"]))
    return out


def sok_step_files(variables, optimizer, record):
    """SOK format: {table file stem: {step file name: the record's bytes}}, which the dump
    publishes with each table's files (one marker names both: never a mix of two dumps)."""
    name = _optimizer_file_name(optimizer)
    return {sok_format.file_stem(v.name): {
        optimizer_steps.file_name(sok_format.file_stem(v.name), name):
            optimizer_steps.encode(record)} for v in variables}


def read_sok_steps(path, variables, optimizer, expected):
    """SOK format: the record the tables' step files hold (None: none does), checked against
    `expected` names. Collective; raises CheckpointError on every rank, before any table
    changes, for a corrupt record, one of another optimizer, or tables whose records differ."""
    host, record, error = runtime.get().host, None, None
    try:
        found = [(where, optimizer_steps.read_file(where))
                 for where in _sok_step_files(path, variables, optimizer)]
        record = optimizer_steps.agreed(found, expected)
    except CheckpointError as exc:
        error = exc
    host.raise_together(error, "sok1x.load of %s" % path)
    return record
