"""Makes every rank issue sok1x's collectives in the same order (DESIGN D3).

TensorFlow runs independent ops in any order, and maybe differently on each rank; two collectives
started in different orders hang the job. So every communicating op is created through
`chained()`, which gives it a control dependency on the previous communicating op of the same
tower. In one sess.run the ops of a tower then run one at a time in creation order on every rank,
whatever inter_op_parallelism_threads is.

A tower is a chain. A new one starts when a forward op is created after backward ops (an eval or
inference tower built after the training op, so fetching it runs no training op and needs no
training feed), or explicitly inside `with new_tower():`. Lookups that Keras makes on symbolic
inputs while building a functional model have a tower of their own, and a backward op always
joins the tower of its forward op. A tower's first op waits for the tower's ticker, a tiny op
with no inputs that counts the tower's calls (engine/op_order.py's clock): it starts with the
sess.run, so it has counted the call even when TensorFlow fails the step on this rank before any
sok1x op runs. At run time the engine checks that each
op directly follows its predecessor in its tower and that all ranks are in the same op
(sok1x.engine.op_order, exchange_header); what cannot be made safe, such as a training and an
evaluation tower fetched in one sess.run, raises OrderError on every rank.
"""
import contextlib

import numpy as np

from sok1x.engine.op_order import CLOCK, OpId
from sok1x.graph_ops import boundary
from sok1x.graph_ops.graph_state import per_graph
from sok1x.graph_ops.tf_compat import tf1

FORWARD, BACKWARD, OTHER = "forward", "backward", "other"


class _Tower:
    def __init__(self, name):
        self.name = name
        self.last_op = None
        self.length = 0
        self.has_backward = False


class _GraphOrdering:
    def __init__(self):
        self.count = 0
        self.tower = self.new_tower()
        self.regular = self.tower  # the tower of ops on real (fed or computed) keys
        self.symbolic = None  # the tower of lookups Keras makes while building a model

    def new_tower(self, hint=None):
        self.count += 1
        return _Tower("%s%d" % (hint + "-" if hint else "tower", self.count))


def _state(graph):
    return per_graph(graph, "ordering", _GraphOrdering)


@contextlib.contextmanager
def new_tower(name=None):
    """Context manager: communicating ops created inside form a tower of their own, independent
    of those created before and after (for example an evaluation tower built before training)."""
    state = _state(tf1.get_default_graph())
    outer = state.tower
    state.tower = state.new_tower(name)
    try:
        yield
    finally:
        state.tower = outer


def after_backward(graph=None):
    """True when a forward op created now would start a new tower: the current one already has
    backward ops (the training step is built; what follows reads or evaluates)."""
    return _state(graph or tf1.get_default_graph()).tower.has_backward


def _forward_tower(state, symbolic_input):
    """Picks the tower of a new forward op. Lookups that Keras makes on symbolic inputs while it
    builds a functional model go to a tower of their own, so that calling the model on real
    keys later is not chained after them (which would ask for a feed of keras.Input)."""
    if symbolic_input:
        if state.symbolic is None or state.symbolic.has_backward:
            state.symbolic = state.new_tower("keras-model")
        state.tower = state.symbolic
        return state.tower
    if state.tower is state.symbolic:
        state.tower = state.regular
    if state.tower.has_backward:
        state.tower = state.new_tower()
    state.regular = state.tower
    return state.tower


def chained(kind, name, build, tower=None, symbolic_input=False):
    """Creates a communicating op in order. kind: FORWARD, BACKWARD or OTHER; name: the op's base
    name; build(op_id) creates the op and returns (outputs, the tf.Operation); tower: for a
    BACKWARD op, the tower of its forward op (default: the current one); symbolic_input: a
    FORWARD op on a Keras model's symbolic input. Returns (outputs, the op's tower)."""
    state = _state(tf1.get_default_graph())
    if kind == FORWARD:
        tower = _forward_tower(state, symbolic_input)
    elif tower is None:
        tower = state.tower
    ticked = tower.length == 0 and not tf1.executing_eagerly()
    op_id = OpId("%s/%s" % (tower.name, name), tower.name, tower.length, ticked)
    deps = [] if tower.last_op is None else [tower.last_op]
    if ticked:
        deps = [_ticker(tower.name)]
    with tf1.control_dependencies(deps):
        outputs, operation = build(op_id)
    tower.last_op = operation
    tower.length += 1
    tower.has_backward = tower.has_backward or kind == BACKWARD
    return outputs, tower


def _ticker(tower_name):
    """Returns an op that counts one call of tower `tower_name` each time it runs. It has no
    inputs, so TensorFlow starts it with the sess.run, before any op that could fail the step."""
    def tick():
        return np.int64(CLOCK.tick(tower_name))
    with tf1.control_dependencies(None):
        return boundary.host_op(tick, [], tf1.int64, tower_name + "_ticker").op
