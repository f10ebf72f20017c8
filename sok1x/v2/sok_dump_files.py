"""sok1x.dump / sok1x.load in SOK v2's own file format (engine/checkpoint/sok_format.py): the
tables of sok1x.Variable and sok1x.DynamicVariable handles and the slots of the optimizer that
trains them, as SOK's dump_load.py writes and reads them. Eager or inside a py_func: these run
at once, collectively."""
import os

import numpy as np

from sok1x.engine import runtime
from sok1x.engine.checkpoint import sok_format
from sok1x.engine.checkpoint.folder_lock import folder_locked
from sok1x.engine.tables import shard_rows
from sok1x.v2 import slot_views
from sok1x.v2.variables import DYNAMIC, VARIABLE, kind_of

SOK_FORMAT, SHARDED_FORMAT = "sok", "sharded"
FORMAT_ENV = "SOK1X_DUMP_FORMAT"


def chosen_format(file_format):
    """Returns "sok" or "sharded": file_format when given, else $SOK1X_DUMP_FORMAT, else
    "sharded". Raises ValueError for another value."""
    value = file_format or os.environ.get(FORMAT_ENV, "") or SHARDED_FORMAT
    if value not in (SOK_FORMAT, SHARDED_FORMAT):
        raise ValueError("sok1x.dump/load: file_format (or %s) must be %r or %r, got %r"
                         % (FORMAT_ENV, SOK_FORMAT, SHARDED_FORMAT, value))
    return value


def is_sok_folder(path, variables):
    """True when folder `path` holds SOK's key file of the first variable and no sok1x
    manifest (a folder SOK dumped)."""
    from sok1x.engine.checkpoint import MANIFEST_NAME
    stem = sok_format.file_stem(variables[0].name)
    return (os.path.exists(os.path.join(path, stem + "-key"))
            and not os.path.exists(os.path.join(path, MANIFEST_NAME)))


class _Table:
    """What the SOK format needs of one variable: its engine table, file stem, owner rank
    (None: spread), key limit, and the (file suffix, slot name, engine slot) of each slot."""

    def __init__(self, variable, optimizer):
        kind = kind_of(variable)
        if kind not in (VARIABLE, DYNAMIC):
            raise TypeError("SOK's dump format holds sok1x.Variable and sok1x.DynamicVariable "
                            "tables; %r is neither" % (getattr(variable, "name", variable),))
        self.name = variable.table_name
        self.stem = sok_format.file_stem(variable.name)
        self.dynamic = kind == DYNAMIC
        self.dim = int(variable.dimension)
        self.key_limit = getattr(variable, "num_rows", None)
        target = getattr(variable, "target_gpu", -1)
        self.owner = None if target is None or target < 0 else int(target)
        self.slots = []
        if optimizer is not None:
            wrapped = getattr(optimizer, "_optimizer", optimizer)
            prefix = sok_format.optimizer_file_name(str(type(wrapped)))
            applier = optimizer._applier() if hasattr(optimizer, "_applier") else optimizer
            for slot in optimizer.get_slot_names():
                view = slot_views.view_of(applier, variable, slot, None)
                if view is None:
                    raise TypeError("%s: the optimizer's slot %r of %s is not one sok1x keeps"
                                    % (self.stem, slot, variable.name))
                self.slots.append(("%s-%s" % (prefix, slot), slot, view.engine_slot))


def _sorted_export(table, slot=None):
    keys, values = shard_rows.export(table.name, table.key_limit, slot)
    if table.dynamic:
        order = np.argsort(keys, kind="stable")
        keys, values = keys[order], values[order]
    return keys, values


def dump(path, variables, optimizer):
    """Writes each variable's table (and `optimizer`'s slots of it) into folder `path` in SOK's
    format. Collective. Raises TypeError, or CheckpointError on every rank (empty table)."""
    tables = [_Table(v, optimizer) for v in variables]
    host = runtime.get().host
    if host.rank == 0:
        os.makedirs(path, exist_ok=True)
    host.barrier()
    # Jobs dumping into (or loading from) one folder take turns, as the sharded format's do.
    with folder_locked(host, path, exclusive=True):
        for table in tables:
            keys, weights = _sorted_export(table)
            if table.owner is not None and not table.dynamic:
                keys = keys.astype(np.uint64)  # SOK writes a localized Variable's keys so
            states = [(suffix, slot, _sorted_export(table, engine)[1])
                      for suffix, slot, engine in table.slots]
            sok_format.write_table(host, path, table.stem, keys, weights, states, table.owner)


def load(path, variables, optimizer):
    """Restores each variable's table (and `optimizer`'s slots) from SOK's files in `path`,
    keeping on each rank the keys sok1x places there (any rank count). Every file is read and
    checked before any table changes. Collective; raises CheckpointError naming the file."""
    tables = [_Table(v, optimizer) for v in variables]
    host = runtime.get().host
    read, error = [], None
    with folder_locked(host, path, exclusive=False):  # not while another job dumps there
        try:
            for table in tables:
                slots = [(suffix, slot) for suffix, slot, _ in table.slots]
                read.append(sok_format.read_table(path, table.stem, table.dim, slots))
        except Exception as caught:  # every rank raises together, none changes a table
            error = caught
        host.raise_together(error, "sok1x.load of %s" % path)
    for table, (keys, weights, states) in zip(tables, read):
        shard_rows.assign(table.name, keys, weights, table.key_limit)
        for (_, _, engine), rows in zip(table.slots, states):
            shard_rows.assign(table.name, keys, rows, table.key_limit, engine)
