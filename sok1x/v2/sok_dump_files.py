"""sok1x.dump / sok1x.load in SOK v2's own file format (engine/checkpoint/sok_format.py), the
default for sok1x.Variable and sok1x.DynamicVariable tables: each table and the slots of the
optimizer that trains it, as SOK's dump_load.py writes and reads them, with sok1x's guarantees
(engine/checkpoint/sok_write.py, sok_read.py, sok_marker.py). Eager or inside a py_func: these
run at once, collectively. Which format a call uses is decided here (chosen_format,
format_to_load)."""
import os

from sok1x.engine.checkpoint import MANIFEST_NAME, sok_format, sok_marker, sok_read, sok_write
from sok1x.v2 import slot_views
from sok1x.v2.variables import DYNAMIC, VARIABLE, kind_of

SOK_FORMAT, SHARDED_FORMAT = "sok", "sharded"
FORMAT_ENV = "SOK1X_DUMP_FORMAT"


def _asked_format(file_format):
    """file_format, else $SOK1X_DUMP_FORMAT, else None. Raises ValueError for another value."""
    value = file_format or os.environ.get(FORMAT_ENV, "") or None
    if value not in (None, SOK_FORMAT, SHARDED_FORMAT):
        raise ValueError("sok1x.dump/load: file_format (or %s) must be %r or %r, got %r"
                         % (FORMAT_ENV, SOK_FORMAT, SHARDED_FORMAT, value))
    return value


def _all_sok_variables(variables):
    return all(kind_of(v) in (VARIABLE, DYNAMIC) for v in variables)


def chosen_format(file_format, variables):
    """The format a dump writes: file_format when given, else $SOK1X_DUMP_FORMAT, else SOK's
    when every variable is a sok1x.Variable or DynamicVariable (SOK v2's tables), else sharded
    (v1 layers' and DeepRec's tables, which SOK's format has no files for). Raises ValueError
    for another value."""
    asked = _asked_format(file_format)
    if asked is not None:
        return asked
    return SOK_FORMAT if _all_sok_variables(variables) else SHARDED_FORMAT


def format_to_load(file_format, path, variables):
    """The format a load reads: file_format or $SOK1X_DUMP_FORMAT when given; for v2 tables,
    what folder `path` holds of them (sok1x's marker of SOK's files or SOK's own key file, or
    sok1x's sharded manifest; both: the newer), SOK's by default; sharded for other tables."""
    asked = _asked_format(file_format)
    if asked is not None:
        return asked
    if not _all_sok_variables(variables):
        return SHARDED_FORMAT
    stems = [sok_format.file_stem(v.name) for v in variables]
    sok_files = sok_read.is_sok_folder(path, stems)
    manifest = os.path.join(path, MANIFEST_NAME)
    if not os.path.exists(manifest):
        return SOK_FORMAT
    if not sok_files:
        return SHARDED_FORMAT
    marker = os.path.join(path, sok_marker.MARKER_NAME)
    newer_sok = os.path.exists(marker) and os.path.getmtime(marker) >= os.path.getmtime(manifest)
    return SOK_FORMAT if newer_sok else SHARDED_FORMAT


def _table(variable, optimizer):
    """The SokTable of a v2 variable and `optimizer`'s slots of it; raises TypeError."""
    kind = kind_of(variable)
    if kind not in (VARIABLE, DYNAMIC):
        raise TypeError("SOK's dump format holds sok1x.Variable and sok1x.DynamicVariable "
                        "tables; %r is neither: dump it with file_format=\"sharded\""
                        % (getattr(variable, "name", variable),))
    stem = sok_format.file_stem(variable.name)
    target = getattr(variable, "target_gpu", -1)
    slots = []
    if optimizer is not None:
        wrapped = getattr(optimizer, "_optimizer", optimizer)
        prefix = sok_format.optimizer_file_name(str(type(wrapped)))
        applier = optimizer._applier() if hasattr(optimizer, "_applier") else optimizer
        for slot in optimizer.get_slot_names():
            view = slot_views.view_of(applier, variable, slot, None)
            if view is None:
                raise TypeError("%s: the optimizer's slot %r of %s is not one sok1x keeps"
                                % (stem, slot, variable.name))
            slots.append(("%s-%s" % (prefix, slot), slot, view.engine_slot))
    return sok_format.SokTable(
        name=variable.table_name, stem=stem, dim=int(variable.dimension),
        dynamic=kind == DYNAMIC, key_limit=getattr(variable, "num_rows", None),
        owner=None if target is None or target < 0 else int(target), slots=tuple(slots))


def _tables(variables, optimizer):
    tables = [_table(v, optimizer) for v in variables]
    stems = [t.stem for t in tables]
    repeated = sorted({s for s in stems if stems.count(s) > 1})
    if repeated:
        raise ValueError("sok1x.dump/load in SOK's format: variables %s share SOK's file names "
                         "%s (each punctuation character becomes '_'): rename them" % (
                             [v.name for v in variables if sok_format.file_stem(v.name)
                              in repeated], repeated))
    return tables


def dump(path, variables, optimizer, extras=None):
    """Writes each variable's table (and `optimizer`'s slots of it) into folder `path` in SOK's
    format; extras: {file stem: {file name: bytes}} published with them (sok_write.py).
    Collective. Raises TypeError or ValueError, or CheckpointError on every rank (empty table,
    a file that cannot be written), leaving the folder's previous dump."""
    sok_write.dump_tables(path, _tables(variables, optimizer), extras)


def load(path, variables, optimizer):
    """Restores each variable's table (and `optimizer`'s slots) from SOK's files in `path`,
    keeping on each rank the keys sok1x places there (any rank count). Every file is checked
    before any table changes. Collective; raises CheckpointError naming the file."""
    sok_read.load_tables(path, _tables(variables, optimizer))
