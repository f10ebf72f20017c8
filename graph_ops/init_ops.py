"""The Init op (DESIGN D4): one per graph, and a dependency of every sok1x variable initializer;
communicating ops also bring sok1x up on first use when the graph has Init options.

`init_op(graph, **options)` records the options and returns the graph's Init op; running it brings
the engine up (sok1x.engine.runtime.init, collective and idempotent). Variable initializers created
before or after sok1x.Init() depend on the same op, which reads the recorded options when it runs.
"""
import numpy as np

from sok1x.engine import runtime
from sok1x.errors import NotInitializedError
from sok1x.graph_ops.graph_state import per_graph
from sok1x.graph_ops.tf_compat import py_func, tf1



class _InitState:
    def __init__(self):
        self.options = None
        self.op = None
        # SOK v2 programs may never call sok.init() in graph mode: their variables bring sok1x
        # up with its defaults (allow_default_init).
        self.default_allowed = False


def _state(graph):
    return per_graph(graph, "init", _InitState)


def _bring_up(state):
    def run():
        if state.options is None and not runtime.is_initialized() and state.default_allowed:
            runtime.init()
        if state.options is None and not runtime.is_initialized():
            raise NotInitializedError(
                "sok1x variables are being initialized, but sok1x.Init() was never called in "
                "this graph: create `sok1x.Init(global_batch_size=...)` and run it (or call "
                "sok1x.init()) first.")
        if state.options is not None:
            runtime.init(**state.options)
        from sok1x.graph_ops import boundary
        boundary.announce()
        return np.int64(runtime.get().size)
    return run


def gate(graph=None):
    """Returns the graph's Init op (an int64 tensor: the world size), creating it on first use.
    Running it initialises sok1x with the options given to the graph's sok1x.Init()."""
    graph = graph or tf1.get_default_graph()
    state = _state(graph)
    if state.op is None:
        with graph.as_default(), tf1.control_dependencies(None), tf1.name_scope(None):
            state.op = py_func(_bring_up(state), [], tf1.int64, name="sok1x_init")
            state.op.set_shape([])
    return state.op


def bring_up_on_first_use(graph=None):
    """Returns ensure(), for communicating ops to call before they use the engine. If sok1x is not
    up yet but the graph's sok1x.Init() recorded options, ensure() brings it up with them (a
    collective: every rank reaches the same first op). So a session that restores every variable
    from a checkpoint, running no initializer, still comes up. Without recorded options it does
    nothing, and the engine call that follows raises "sok1x is not initialized"."""
    state = _state(graph or tf1.get_default_graph())

    def ensure():
        if state.options is not None and not runtime.is_initialized():
            runtime.init(**state.options)
        elif state.default_allowed and not runtime.is_initialized():
            runtime.init()
    return ensure


def allow_default_init(graph=None):
    """Lets the graph's Init op and first communicating ops bring sok1x up with its default
    options when the program never calls sok1x.Init() or sok1x.init() (SOK v2 programs in graph
    mode: their variables and lookups work without it). Collective, as sok1x.init()."""
    _state(graph or tf1.get_default_graph()).default_allowed = True


def init_op(**options):
    """Records sok1x.Init() options for the default graph and returns its Init op."""
    graph = tf1.get_default_graph()
    _state(graph).options = dict(options)
    return gate(graph).op
