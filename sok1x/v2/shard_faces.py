"""A sok1x v2 variable as SOK's variable looks to the program, in graph mode and executing eagerly.

To TensorFlow the variable is its handle (sok1x/common/handle_variable.py), a [1] float32
resource variable. SOK's variable is this rank's shard of the table, and the program sees that:

    sok1x.Variable          shape          [rows held on this rank, dim]
                            read_value()   those rows (a tensor in graph mode), in the order
                                           sok1x.export gives them; executing eagerly also
                                           value(), numpy() and tf.convert_to_tensor(var)
                            assign(value)  writes value [rows held here, dim] over them;
                                           assign_add / assign_sub add to / subtract from them
    sok1x.DynamicVariable   shape          [None, dim] (its rows come and go, as SOK's)
                            read_value, value, numpy, assign*: NotImplementedError naming
                            sok1x.export / sok1x.assign (SOK's raise NotImplementedError too)

In graph mode sess.run(var) fetches a sok1x.Variable's rows too (as var.eval(session)).

A value of the handle's own shape [1] is what TensorFlow, Keras and Horovod write when they treat
the variable as the variable it is to them (hvd.BroadcastGlobalVariablesHook's broadcast, a
restore of the handle): assign* writes the handle then, never the table (a shard is [rows, dim]).
A value of any other shape than the shard's is an InvalidInputError that changes nothing.
TensorFlow, Keras, Horovod and sok1x itself still see the handle's [1] shape and read it with
embedding_tag.handle_value: they build the handle's slots, Savers, checkpoints and function
signatures from it.
"""
import sys

from sok1x.graph_ops.tf_compat import tf1
from sok1x.v2 import shard_access

_FRAMEWORKS = frozenset(["tensorflow", "keras", "tf_keras", "horovod", "sok1x"])
_classes = {}


def show_as_sok(handle, key_count=None):
    """Gives the v2 variable's handle `handle` SOK's face (above); with key_count() (int64 [1]),
    executing eagerly, `size` is read anew each time (SOK's DynamicVariable.size). Returns
    handle (the same object)."""
    key = (type(handle), handle.sok1x_kind == "dynamic", tf1.executing_eagerly())
    if key not in _classes:
        _classes[key] = _face_class(*key)
    handle._sok1x_key_count = key_count
    handle.__class__ = _classes[key]
    return handle


def _asked_by_framework(frame):
    """True when `frame` (the code asking for a shape) is TensorFlow's, Keras', Horovod's or
    sok1x's: slot creation, Savers, tf.train.Checkpoint and tf.function read the shape of the
    handle variable they save and restore, never SOK's."""
    return frame.f_globals.get("__name__", "").partition(".")[0] in _FRAMEWORKS


def _of_handle_shape(value):
    """True for a value whose static shape is the handle's [1]."""
    shape = getattr(value, "shape", None)
    if shape is None:
        shape = tf1.convert_to_tensor(value).shape
    shape = tf1.TensorShape(shape)
    return shape.rank == 1 and shape.as_list() == [1]


def _no_rows(variable, what):
    return NotImplementedError(
        "%s of the sok1x.DynamicVariable %s: its rows come and go with the keys looked up, so it "
        "has no fixed value (as SOK's). Read this rank's rows with sok1x.export(var) -> (keys, "
        "values) and write rows by key with sok1x.assign(var, keys, values)"
        % (what, variable.name))


def _face_class(base, dynamic, eager):
    class SokFace(base):
        """A sok1x v2 variable's handle with SOK's face (sok1x/v2/shard_faces.py)."""

        @property
        def shape(self):
            if _asked_by_framework(sys._getframe(1)):
                return base.shape.fget(self)
            return shard_access.shard_shape(self)

        def get_shape(self):
            if _asked_by_framework(sys._getframe(1)):
                return base.shape.fget(self)
            return shard_access.shard_shape(self)

        def _sok1x_handle_value(self):
            return base.read_value(self)

        def __repr__(self):
            return "<sok1x.%s '%s' shape=%s dtype=float32>" % (
                "DynamicVariable" if dynamic else "Variable", self.name,
                shard_access.shard_shape(self))

        if dynamic:
            def read_value(self):
                raise _no_rows(self, "read_value()")

            def assign(self, value, use_locking=None, name=None, read_value=True):
                if _of_handle_shape(value):
                    return base.assign(self, value, use_locking, name, read_value)
                raise _no_rows(self, "assign()")

            def assign_add(self, delta, use_locking=None, name=None, read_value=True):
                if _of_handle_shape(delta):
                    return base.assign_add(self, delta, use_locking, name, read_value)
                raise _no_rows(self, "assign_add()")

            def assign_sub(self, delta, use_locking=None, name=None, read_value=True):
                if _of_handle_shape(delta):
                    return base.assign_sub(self, delta, use_locking, name, read_value)
                raise _no_rows(self, "assign_sub()")

            if eager:
                def value(self):
                    raise _no_rows(self, "value()")

                def numpy(self):
                    raise _no_rows(self, "numpy()")

                @property
                def size(self):
                    return self._sok1x_key_count()
        else:
            def read_value(self):
                return shard_access.read_shard(self)

            def assign(self, value, use_locking=None, name=None, read_value=True):
                if _of_handle_shape(value):
                    return base.assign(self, value, use_locking, name, read_value)
                written = shard_access.write_shard(self, value, "%s.assign" % self.name)
                return _assigned(self, written, read_value)

            def assign_add(self, delta, use_locking=None, name=None, read_value=True):
                if _of_handle_shape(delta):
                    return base.assign_add(self, delta, use_locking, name, read_value)
                total = shard_access.read_shard(self) + _checked(self, delta, "assign_add")
                written = shard_access.write_shard(self, total, "%s.assign_add" % self.name)
                return _assigned(self, written, read_value)

            def assign_sub(self, delta, use_locking=None, name=None, read_value=True):
                if _of_handle_shape(delta):
                    return base.assign_sub(self, delta, use_locking, name, read_value)
                total = shard_access.read_shard(self) - _checked(self, delta, "assign_sub")
                written = shard_access.write_shard(self, total, "%s.assign_sub" % self.name)
                return _assigned(self, written, read_value)

            if not eager:
                def _as_graph_element(self):
                    # sess.run(var): this rank's rows, read by one op made in the variable's graph
                    if getattr(self, "_sok1x_fetch", None) is None:
                        with tf1.init_scope():
                            self._sok1x_fetch = shard_access.read_shard(self)
                    return self._sok1x_fetch

            if eager:
                def value(self):
                    return shard_access.read_shard(self)

                def numpy(self):
                    return shard_access.read_shard(self).numpy()

                def _dense_var_to_tensor(self, dtype=None, name=None, as_ref=False):
                    if as_ref:
                        return base._dense_var_to_tensor(self, dtype, name, as_ref)
                    value = shard_access.read_shard(self)
                    return value if dtype is None else tf1.cast(value, dtype)
    return SokFace


def _checked(variable, delta, what):
    """delta as float32, refused (nothing written) unless it has the shard's shape: a [1] or
    scalar delta would otherwise broadcast over every row."""
    return shard_access.check_shard_value(variable, delta, "%s.%s" % (variable.name, what))


def _assigned(variable, written, read_value):
    """What tf.Variable.assign returns: executing eagerly the variable (read_value=True) or None;
    in graph mode the new rows after the write (read_value=True) or the write op."""
    if tf1.executing_eagerly():
        return variable if read_value else None
    if not read_value:
        return written
    with tf1.control_dependencies([written]):
        return shard_access.read_shard(variable)
