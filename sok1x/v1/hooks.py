"""SessionRunHooks for MonitoredTrainingSession: bring sok1x up, broadcast dense variables.

Both build their ops in begin() and run them in after_create_session(), as Horovod's hooks do.
"""
from sok1x.graph_ops.embedding_tag import is_embedding_variable
from sok1x.graph_ops import collective_ops, init_ops
from sok1x.graph_ops.tf_compat import tf1


class InitHook(tf1.train.SessionRunHook):
    """Runs sok1x.Init(**options) when the session is created. Variable initializers depend on the
    Init op anyway; this hook also covers sessions that restore every variable from a checkpoint."""

    def __init__(self, **options):
        self._options = options
        self._op = None

    def begin(self):
        self._op = init_ops.init_op(**self._options)

    def after_create_session(self, session, coord):
        session.run(self._op)


class BroadcastGlobalVariablesHook(tf1.train.SessionRunHook):
    """Sets every global variable to rank `root_rank`'s value once the session exists, so dense
    layers start equal on every rank. sok1x embedding variables are skipped: their handles are
    equal everywhere and their tables are sharded, not replicated."""

    def __init__(self, root_rank=0):
        self._root_rank = int(root_rank)
        self._op = None

    def begin(self):
        variables = [v for v in tf1.global_variables() if not is_embedding_variable(v)]
        self._op = collective_ops.broadcast_variables(variables, self._root_rank)

    def after_create_session(self, session, coord):
        session.run(self._op)
