"""Names of sok1x tables, unique per graph as TensorFlow makes op names unique (emb, emb_1, ...).

Two v1 layers built with the same name in one graph must not share a table (training one would
move the other, and with other settings the mismatch would only show at run time, on one rank).
The first layer named `emb` gets table `emb/EmbeddingVariable`, the next `emb_1/EmbeddingVariable`,
and so on, in the order the layers are built, which is the same on every rank. A model built
again in another graph (an eval graph, a restored one) gets the same names there, and so the
same tables. Eagerly the default graph stands for the process.
"""
from sok1x.graph_ops.graph_state import per_graph
from sok1x.graph_ops.tf_compat import tf1


def claim_table_name(scope, leaf):
    """Returns `scope/leaf` with the first of scope, scope_1, scope_2, ... that no sok1x table of
    the default graph has taken yet, and takes it."""
    taken = per_graph(tf1.get_default_graph(), "table_names", set)
    candidate, count = scope, 0
    while "%s/%s" % (candidate, leaf) in taken:
        count += 1
        candidate = "%s_%d" % (scope, count)
    name = "%s/%s" % (candidate, leaf)
    taken.add(name)
    return name
