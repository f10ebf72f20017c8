"""The rest of SOK v2's public names that its programs use beside Variable and lookup_sparse:

    tf.nn.embedding_lookup(var, ids)   reads rows of a sok1x variable (SOK's variables are
                                       resource variables whose sparse_read looks keys up);
                                       differentiable, as the lookup of sok1x.lookup_sparse;
                                       collective, except for a "localized:r" variable, read
                                       on rank r alone as SOK reads it
    var.eval(session)                  this rank's rows, [local rows, dim] (SOK's value of a
                                       distributed variable)
    sok1x.all2all_dense_embedding(var, ids)  the same lookup, SOK's functional name
    sok1x.sparse_read_and_evict(var, ids)    the lookup, then the keys it evicted
    sok1x.SGD(lr)                      SOK's own optimizer (plain SGD on the rows touched)
    sok1x.filter_variables(vars)       ([sok1x variables], [others])
"""
from sok1x.engine.tables import placement as placements
from sok1x.engine.tables import shard_rows
from sok1x.graph_ops import boundary, embedding_ops, init_ops, ordering, pooled_lookup_ops
from sok1x.graph_ops.embedding_tag import handle_value, table_of
from sok1x.graph_ops.tf_compat import tf1


def _lookup(variable, ids, name):
    """float32 [*ids.shape, dim]: the rows of int keys `ids` of sok1x variable `variable`, from
    whichever rank holds them (keys a DynamicVariable lacks are inserted)."""
    table = table_of(variable)
    if table is None:
        raise TypeError("%s: %r is not a sok1x variable" % (name, getattr(variable, "name",
                                                                          variable)))
    ids = tf1.convert_to_tensor(ids)
    if ids.dtype in (tf1.uint32, tf1.uint64):
        ids = tf1.cast(ids, tf1.int64)
    if placements.parse(table.placement).kind == "rank":
        return _local_lookup(variable, table, ids, name)
    if tf1.executing_eagerly():
        return _eager_lookup(variable, table, ids, name)
    if not ordering.after_backward():
        return embedding_ops.dense_lookup(table, handle_value(variable), ids, True, None, name)
    # A read built after the training step (SOK programs read variables this way to check
    # them, one sess.run each) is a tower of its own, needing no other read's feed.
    with ordering.new_tower(name):
        return embedding_ops.dense_lookup(table, handle_value(variable), ids, True, None, name)


def _eager_lookup(variable, table, ids, name):
    """Executing eagerly (a tf.GradientTape step or a check): the pooled lookup of
    pooled_lookup_ops with every key a segment of its own, summed, which gives the dense
    lookup's rows and gradient (collective, as SOK's eager reads)."""
    keys = tf1.reshape(ids, [-1])
    count = tf1.size(keys, out_type=tf1.int64)
    item = pooled_lookup_ops.TableInput(keys, tf1.range(count), count, None, "sum")
    vectors, = pooled_lookup_ops.pooled_lookup(
        [table], [variable], [item], [getattr(variable, "num_rows", None)], name)
    return tf1.reshape(vectors, tf1.concat([tf1.shape(ids, out_type=tf1.int32), [table.dim]], 0))


def _local_lookup(variable, table, ids, name):
    """The read of a localized variable ("localized:r": every row on rank r), as SOK's: local to
    the rank that runs it (the rank holding the rows), no collective, so a program may read it
    on that rank alone. Its gradient is the handle's IndexedSlices of shard rows, as the
    lookups' are."""
    key_limit = getattr(variable, "num_rows", None)
    ensure_up = init_ops.bring_up_on_first_use()

    def run(keys, _handle):
        ensure_up()
        return shard_rows.read_local(table.name, keys, key_limit)

    @tf1.custom_gradient
    def read(handle_read):
        vectors, rows = boundary.engine_op(run, [ids, handle_read], [tf1.float32, tf1.int64],
                                           name, unread_inputs=(1,))
        vectors.set_shape([None, table.dim])
        rows.set_shape([None])

        def gradient(upstream):
            unique_rows, position = tf1.unique(rows)
            summed = tf1.math.unsorted_segment_sum(tf1.reshape(upstream, [-1, table.dim]),
                                                   position, tf1.size(unique_rows))
            return tf1.IndexedSlices(summed, unique_rows,
                                     tf1.constant([table.capacity, table.dim], tf1.int64))
        return vectors, gradient

    vectors = read(handle_value(variable))
    return tf1.reshape(vectors, tf1.concat([tf1.shape(ids, out_type=tf1.int32), [table.dim]], 0))


def all2all_dense_embedding(param, ids):
    """SOK v2's functional dense lookup: float32 [*ids.shape, dim], the rows of `ids` (global
    keys) of sok1x variable `param`, with its gradient as tf.nn.embedding_lookup's."""
    return _lookup(param, ids, "all2all_dense_embedding")


def sparse_read_and_evict(variable, indices=None):
    """SOK's two-argument form: returns (the rows of `indices`, as all2all_dense_embedding gives
    them, then the keys int64 [n] and values float32 [n, dim] that this rank's shard of the
    hybrid DynamicVariable evicted since the last call, each once; the first call's: since it was
    built, or called eagerly, as a DynamicVariable drops what it evicts until something reads
    it). With indices=None, returns only the evicted (keys, values), sok1x's earlier one-argument
    form."""
    from sok1x.v2 import shard_access
    if indices is None:
        return shard_access.evicted(variable)
    shard_access.read_evicted(variable)  # first: this lookup's evicted keys are kept
    rows = _lookup(variable, indices, "sparse_read_and_evict")
    with tf1.control_dependencies([rows]):
        keys, values = shard_access.evicted(variable)
    return rows, keys, values


def attach_reads(handle, local_rows):
    """Gives a v2 variable's handle SOK's reads: sparse_read (what tf.nn.embedding_lookup and
    tf.gather call on a resource variable) looks keys up in the table, and eval(session) returns
    local_rows() ([local rows, dim], a tensor made once per graph)."""
    def sparse_read(indices, name=None):
        return _lookup(handle, indices, name or "sparse_read")

    built = {}

    def evaluate(session=None, feed_dict=None):
        graph = handle.graph
        if graph not in built:
            with graph.as_default():
                built[graph] = local_rows()
        session = session or tf1.get_default_session()
        return session.run(built[graph], feed_dict=feed_dict)

    handle.sparse_read = sparse_read
    handle.eval = evaluate
    return handle


def filter_variables(variables):
    """SOK v2's filter_variables: returns ([sok1x variables], [other variables]) of
    `variables`, each in the given order (SOK v1's split_embedding_variable_from_others)."""
    from sok1x.common.handle_variable import split_embedding_variable_from_others
    return split_embedding_variable_from_others(variables)


def SGD(lr=0.01, learning_rate=None, name="SGD", **kwargs):  # noqa: N802  (SOK's name)
    """SOK v2's own optimizer: plain SGD, rows -= lr * gradient, on sok1x variables (their rows
    touched this step) and any other variable alike. Returns an optimizer whose
    apply_gradients(zip(grads, vars)) returns the update op."""
    del kwargs
    rate = lr if learning_rate is None else learning_rate
    return tf1.train.GradientDescentOptimizer(rate, name=name)

