"""An optimizer's slot of a sok1x variable as SOK shows it: what `optimizer.get_slot(var, name)`
returns for a sok1x.Variable or DynamicVariable handle (SOK's slots are variables of the local
shard's shape, or DynamicVariables). A SlotView is a view of that slot's rows in the variable's
engine table (engine/tables/table.py keeps a table's slots beside its rows), not a variable of its
own: sok1x.export(view) and sok1x.assign(view, keys, values) read and write those rows by key,
and, as for a variable, view.numpy() (eagerly), view.read_value() and view.assign(value) read
and write every row of this rank's shard, in the order sok1x.export gives them. dump / load
carry the slot with its table.
"""
from sok1x.engine.tables.optimizer_updates import slot_key
from sok1x.graph_ops.tf_compat import tf1, trackable_base
from sok1x.optimizers import embedding_update, native_rules
from sok1x.v2 import shard_access


class SlotView(trackable_base()):
    """The slot `slot_name` of optimizer `optimizer` for sok1x variable `variable` (its handle),
    held in the engine as `engine_slot` (name, initial value). Attributes as the variable's:
    table_name, dimension, num_rows, mode, target_gpu; `variable` is the handle."""

    def __init__(self, variable, slot_name, engine_slot):
        self.variable = variable
        self.slot_name = slot_name
        self.engine_slot = tuple(engine_slot)
        self.table_name = variable.table_name
        self.dimension = variable.dimension
        self.num_rows = variable.num_rows
        self.mode = variable.mode
        self.target_gpu = variable.target_gpu
        self.dtype = tf1.float32
        self.trainable = False

    @property
    def name(self):
        return "%s/%s:0" % (self.variable.name.split(":")[0], self.slot_name)

    def read_value(self):
        """float32 [rows held here, dim]: this rank's rows of the slot (a tensor in graph
        mode)."""
        return shard_access.read_shard(self)

    value = read_value

    def numpy(self):
        """Executing eagerly: this rank's rows of the slot as a NumPy array."""
        return self.read_value().numpy()

    @property
    def shape(self):
        """Its variable's SOK shape: [rows held here, dim] (a sok1x.Variable's slot), [None,
        dim] (a DynamicVariable's)."""
        return shard_access.shard_shape(self)

    def assign(self, value, use_locking=None, name=None, read_value=False):
        """Writes float [rows held here, dim] `value` over this rank's rows of the slot (the
        rows of read_value(), in its order). Returns the op in graph mode. Raises
        InvalidInputError for a value of another shape, changing nothing."""
        del use_locking, name, read_value
        return shard_access.write_shard(self, value, "%s.assign" % self.name)

    def __repr__(self):
        return "<sok1x slot %r of %s (engine slot %s)>" % (self.slot_name, self.variable.name,
                                                          self.engine_slot[0])


def view_of(optimizer, variable, slot_name, slot):
    """What get_slot gives for sok1x variable `variable`: a SlotView of its engine slot when
    `optimizer` (a native optimizer sok1x applies to it) keeps slot `slot_name` there, else
    `slot` (what the optimizer itself returned) unchanged."""
    if getattr(variable, "sok1x_kind", None) is None:
        return slot  # not a v2 variable (a v1 layer's handle, a DeepRec group's)
    engine = native_rules.engine_slot(optimizer, slot_name)
    if engine is None:
        return slot
    engine_name, initial = engine
    prefix = embedding_update.known_slot_prefix(optimizer)
    return SlotView(variable, slot_name, (slot_key(prefix, engine_name), initial))
