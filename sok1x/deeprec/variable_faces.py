"""The rows of a plain TensorFlow variable that a group lookup shards (plain_variables.py), read
and written as one [vocab, dim] table whatever the variable is made of:

- a tf.Variable [vocab, dim]: its own rows;
- a PartitionedVariable (tf.compat.v1.get_variable with a partitioner) of n partitions along
  the rows: row k is row k // n of partition k % n, as TensorFlow's lookups over it read it
  (tf.nn.embedding_lookup(_sparse)'s default partition_strategy "mod", the only one group
  lookups take). TensorFlow's partitioners give the first vocab % n partitions one row more,
  which is exactly that layout.
"""
import numpy as np

from sok1x.graph_ops.tf_compat import is_partitioned_variable, tf1


class _Whole:
    """A tf.Variable [vocab, dim]."""

    def __init__(self, variable):
        self.variable = variable
        self.parts = [variable]
        self.name = variable.op.name

    def read(self):
        """A tensor of the variable's rows, read now."""
        return self.variable.read_value()

    def assign(self, rows):
        """An op writing `rows` [vocab, dim] into the variable."""
        return self.variable.assign(rows, read_value=False)

    def scatter(self, keys, rows):
        """An op writing `rows` [n, dim] into the variable's rows `keys` (int64 [n])."""
        return tf1.scatter_update(self.variable, keys, rows).op


class _Partitioned:
    """A PartitionedVariable split along its rows, read and written in "mod" order."""

    def __init__(self, variable):
        self.variable = variable
        self.parts = list(variable)
        self.name = variable.name
        vocab, count = int(variable.shape[0]), len(self.parts)
        self._rows = [np.arange(p, vocab, count, dtype=np.int64) for p in range(count)]
        for index, (part, rows) in enumerate(zip(self.parts, self._rows)):
            if part.shape[0] != len(rows) or part.shape[1:] != variable.shape[1:]:
                raise ValueError(
                    "group_embedding_lookup_sparse: partition %d of %s has shape %s; sok1x "
                    "reads a partitioned variable as TensorFlow's \"mod\" lookups do (row k in "
                    "partition k %% %d), which needs partitions of shape [%d, %s] (TensorFlow's "
                    "partitioners along the rows make those)"
                    % (index, self.name, part.shape, count, len(rows), variable.shape[1]))

    def read(self):
        return tf1.dynamic_stitch([tf1.constant(rows, tf1.int32) for rows in self._rows],
                                  [part.read_value() for part in self.parts])

    def assign(self, rows):
        return tf1.group(*[part.assign(tf1.gather(rows, tf1.constant(ids)), read_value=False)
                           for part, ids in zip(self.parts, self._rows)])

    def scatter(self, keys, rows):
        count = len(self.parts)
        ops = []
        for index, part in enumerate(self.parts):
            mine = tf1.reshape(tf1.where(tf1.equal(keys % count, index)), [-1])
            ops.append(tf1.scatter_update(part, tf1.gather(keys, mine) // count,
                                          tf1.gather(rows, mine)).op)
        return tf1.group(*ops)


def is_plain_table(value):
    """True for what a group lookup takes as a plain TensorFlow table: a tf.Variable or a
    PartitionedVariable."""
    return is_partitioned_variable(value) or (hasattr(value, "initial_value")
                                              and hasattr(value, "op"))


def face_of(variable):
    """The rows of `variable` (a tf.Variable or a PartitionedVariable) as one table: an object
    with .variable, .parts (its tf.Variables), .name, .read(), .assign(rows) and
    .scatter(keys, rows). Raises
    ValueError for a partitioned variable not split along its rows as "mod" lookups read it."""
    if not is_partitioned_variable(variable):
        return _Whole(variable)
    partitions = list(variable._get_partitions())  # [n, 1]: split along the rows only
    if any(count != 1 for count in partitions[1:]):
        raise ValueError("group_embedding_lookup_sparse: %s is partitioned %s; sok1x takes "
                         "partitioned tables split along their rows only"
                         % (variable.name, partitions))
    return _Partitioned(variable)
