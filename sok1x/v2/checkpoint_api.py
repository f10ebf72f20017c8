"""SOK's dump / load / incremental_model_dump for sok1x tables (DESIGN D8).

`vars` are the tables' variables: sok1x.Variable / DynamicVariable handles (SOK v2's), the v1
layers' handle variables (layer.var), or any object with a table (anything
sok1x.graph_ops.embedding_tag.table_of() knows, or with a `table_name`). Two formats, both
written in bounded memory and published whole (a crash leaves the previous dump loadable), both
loadable on any number of ranks; the folder must be one that every rank sees:
  - SOK's own files (v2/sok_dump_files.py), the default for SOK v2's tables, as SOK writes
    them, so SOK's readers read them: `<name>-key`, `-weight`, `-<Optimizer>-<slot>` (only
    `optimizer`'s slots, none without one, as SOK does);
  - sok1x's sharded format (engine/checkpoint/tables.py), the default for other tables, or
    file_format="sharded" / SOK1X_DUMP_FORMAT=sharded: every rank its own shard file, then the
    manifest (sok1x-checkpoint.json); optimizer=None there means every slot.
In graph mode dump and load return an op (run it on every rank, at the same point); eagerly
they run at once.
"""
import datetime

from sok1x.graph_ops.embedding_tag import table_of
from sok1x.engine import checkpoint
from sok1x.v2 import checkpoint_steps, sok_dump_files


def table_names(variables):
    """Returns the table name of each variable; raises TypeError naming one that has none."""
    if not isinstance(variables, (list, tuple)):
        variables = [variables]
    names = []
    for variable in variables:
        spec = table_of(variable)
        name = getattr(spec, "name", None) or getattr(variable, "table_name", None)
        if name is None:
            raise TypeError("%r is not a sok1x embedding variable: pass the layers' variables "
                            "(layer.var / layer.embedding_variable)" % (variable,))
        names.append(name)
    return names


def _slot_prefixes(optimizer, loading=False):
    """The slot prefix in the tables of `optimizer` (a sok1x.OptimizerWrapper: of the optimizer
    it applies to sok1x variables), as a list; None for every slot. loading: an optimizer that
    has updated no table yet takes its prefix now, the one its first update will use (a load
    before the first step, as a restarted program makes its optimizers in the same order)."""
    if optimizer is None:
        return None
    from sok1x.optimizers.embedding_update import known_slot_prefix, slot_prefix
    applier = getattr(optimizer, "_applier", None)
    applier = applier() if callable(applier) else optimizer
    return [(slot_prefix if loading else known_slot_prefix)(applier)]


def _run_or_op(function, name):
    """Runs function() now (eager) or returns an op that runs it (graph mode)."""
    return checkpoint_steps.StepState(None, []).dump_op(lambda _: function(), name)


def _listed(variables):
    return list(variables) if isinstance(variables, (list, tuple)) else [variables]


def dump(path, vars, optimizer=None, file_format=None):  # noqa: A002  (SOK's parameter name)
    """Writes each variable's table into folder `path`. Collective.

    sok1x.Variable / DynamicVariable tables go, by default, into SOK's own files
    (`<name>_0-key`, `-weight`, `-<Optimizer>-<slot>` with SOK's header, byte for byte, as
    SOK's sok.dump writes them; SOK's readers and sok.load read them): only `optimizer`'s
    slots, none without one, as SOK does. file_format="sharded" (or SOK1X_DUMP_FORMAT=sharded),
    and the default for other tables: sok1x's sharded format, every rank its own shard (keys,
    values, slots of `optimizer`, or every slot when None), then the manifest.
    file_format="sok" (or SOK1X_DUMP_FORMAT=sok) asks for SOK's files.
    With an optimizer whose step counters sok1x keeps (a sok1x.OptimizerWrapper, a TF 2.11+
    Keras optimizer applied to sok1x variables), they are written too (checkpoint_steps.py)."""
    variables = _listed(vars)
    optimizer = checkpoint_steps.applying(optimizer, variables)
    steps = checkpoint_steps.StepState(optimizer, variables)
    if sok_dump_files.chosen_format(file_format, variables) == sok_dump_files.SOK_FORMAT:
        def write_sok_files(record):  # the step record published with the tables' files
            sok_dump_files.dump(path, variables, optimizer, None if record is None else
                                checkpoint_steps.sok_step_files(variables, optimizer, record))
        return steps.dump_op(write_sok_files, "sok1x_dump_sok_files")
    names, prefixes = table_names(vars), _slot_prefixes(optimizer)
    return steps.dump_op(lambda record: checkpoint.dump_tables(
        path, names, prefixes, None if record is None else (prefixes[0], record)), "sok1x_dump")


def load(path, vars, optimizer=None, file_format=None):  # noqa: A002
    """Restores each variable's table from `path` (written by dump on any number of ranks).
    SOK's files (file_format="sok" or SOK1X_DUMP_FORMAT=sok; else found in the folder for
    sok1x.Variable / DynamicVariable tables: sok1x's dump in SOK's format, or SOK's own) load
    SOK's way: the files' rows (and `optimizer`'s slots) written over the table's. A sharded
    dump (file_format="sharded", or the folder's manifest, the newer where both are there):
    the table then holds exactly the dump's rows and slots (only `optimizer`'s when given).
    The step counters sok1x keeps for `optimizer` (see dump) get their dumped values
    (unchanged where the dump holds none). Collective; raises sok1x.errors.CheckpointError for
    a missing, corrupt or mismatched file, changing no table."""
    variables = _listed(vars)
    optimizer = checkpoint_steps.applying(optimizer, variables)
    steps = checkpoint_steps.StepState(optimizer, variables)
    prefixes = _slot_prefixes(optimizer, loading=True)
    chosen = sok_dump_files.format_to_load(file_format, path, variables)
    if chosen == sok_dump_files.SOK_FORMAT:
        def read_sok_files():
            record = None
            if steps.named:
                record = checkpoint_steps.read_sok_steps(path, variables, optimizer, steps.names())
            sok_dump_files.load(path, variables, optimizer)
            return record
        return steps.load_op(read_sok_files, "sok1x_load_sok_files")
    names = table_names(vars)
    recorded = (prefixes[0], steps.names()) if steps.named else None
    return steps.load_op(lambda: checkpoint.load_tables(path, names, prefixes, recorded),
                         "sok1x_load")


def load_values(path, vars):  # noqa: A002
    """Restores each variable's rows from `path` (written by dump), leaving every optimizer
    slot at its initial value (SOK v1's Saver.restore_from_file restores embedding values
    only). Collective."""
    names = table_names(vars)
    return _run_or_op(lambda: checkpoint.load_tables(path, names, []), "sok1x_load_values")


def _seconds(utc_time):
    if isinstance(utc_time, datetime.datetime):
        if utc_time.tzinfo is None:
            utc_time = utc_time.replace(tzinfo=datetime.timezone.utc)
        return utc_time.timestamp()
    return float(utc_time)


def incremental_model_dump(vars, utc_time, sess=None):  # noqa: A002
    """Returns (keys, values), lists with one NumPy array per variable: the rows inserted or
    updated at or after `utc_time` (a datetime, naive meaning UTC, or seconds since the epoch),
    the same on every rank. Collective; runs at once, between steps. sess: SOK's TF1 form
    passes its session; sok1x reads the tables directly and does not need it."""
    del sess
    out = checkpoint.incremental_tables(table_names(vars), _seconds(utc_time))
    return [keys for keys, _ in out], [values for _, values in out]
