"""Dense data-parallel collectives, so a job needs no Horovod: a fused all-reduce for dense
gradients and a broadcast of variables from one rank. Both are chained like every communicating
op (ordering.py) and safe beside Horovod, which keeps its own communicator."""
import numpy as np

from sok1x.engine import api
from sok1x.errors import Sok1xError
from sok1x.graph_ops import boundary, init_ops, ordering
from sok1x.graph_ops.embedding_ops import is_embedding_gradient
from sok1x.graph_ops.embedding_tag import is_embedding_variable
from sok1x.graph_ops.tf_compat import tf1


def _dense(tensor, position):
    if is_embedding_gradient(tensor):
        raise Sok1xError(
            "sok1x.allreduce got the gradient of a sok1x embedding variable (item %d). Embedding "
            "gradients hold rows of this rank's own shard; all-reducing them would add up "
            "different rows. Apply them with sok1x.optimizers or inside sok1x.OptimizerScope, and "
            "all-reduce only the dense gradients (see sok1x.split_embedding_variable_from_others)."
            % position)
    return tf1.convert_to_tensor(tensor)


def allreduce(tensors, average=True, name="sok1x_allreduce"):
    """Sums (average=True: averages) tensors over all ranks, fused into one collective per dtype.
    tensors: a tensor or a list of tensors (IndexedSlices are made dense; None is passed through).
    Returns the same structure. Raises Sok1xError for a sok1x embedding gradient."""
    single = not isinstance(tensors, (list, tuple))
    items = [tensors] if single else list(tensors)
    dense = [None if t is None else _dense(t, i) for i, t in enumerate(items)]
    results = list(dense)
    ensure_up = init_ops.bring_up_on_first_use()
    by_dtype = {}
    for i, t in enumerate(dense):
        if t is not None:
            by_dtype.setdefault(t.dtype, []).append(i)
    for dtype, positions in sorted(by_dtype.items(), key=lambda item: item[0].name):
        group = [dense[i] for i in positions]

        def build(op_id, group=group, dtype=dtype):
            def run(*arrays):
                ensure_up()
                return api.allreduce(op_id, list(arrays), average)
            outputs = boundary.host_op(run, group, [dtype] * len(group),
                                       "%s_%s" % (name, dtype.name))
            for out, src in zip(outputs, group):
                out.set_shape(src.shape)
            return outputs, outputs[0].op

        for i, out in zip(positions, ordering.chained(ordering.OTHER, name, build)[0]):
            results[i] = out
    return results[0] if single else results


def broadcast_variables(variables, root_rank=0, name="sok1x_broadcast"):
    """Returns an op that sets every variable in `variables` to rank `root_rank`'s value, sok1x
    embedding variables left out (their rows are each rank's own shard of the table, and their
    handles are the same on every rank). It forms a tower of its own, so running it alone never
    waits for training ops."""
    variables = [v for v in variables if not is_embedding_variable(v)]
    if not variables:
        return tf1.no_op(name=name)
    with ordering.new_tower("broadcast"):
        ensure_up = init_ops.bring_up_on_first_use()

        def build(op_id):
            def run(*arrays):
                ensure_up()
                return [np.asarray(a) for a in api.broadcast(op_id, list(arrays), root_rank)]
            values = [v.read_value() if hasattr(v, "read_value") else v for v in variables]
            outputs = boundary.host_op(run, values, [v.dtype.base_dtype for v in variables],
                                       name)
            for out, v in zip(outputs, variables):
                out.set_shape(v.shape)
            return outputs, outputs[0].op
        outputs, _ = ordering.chained(ordering.OTHER, name, build)
    return tf1.group(*[v.assign(out) for v, out in zip(variables, outputs)], name=name + "_assign")
