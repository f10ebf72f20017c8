"""SOK v2's sparse_operation_kit.communication: the job's ranks as SOK numbers them (one GPU per
rank, so a rank's global GPU id is its rank) and its dense collectives. sok1x talks MPI whatever
the tool, so set_comm_tool only records SOK's "horovod". Every function but set_comm_tool needs
sok1x up (sok1x.init() / sok1x.Init()) and raises RuntimeError saying so before."""
from sok1x.engine import runtime

_TOOLS = ("horovod",)
_tool = [None]


def set_comm_tool(tool):
    """Records the communication tool ("horovod"); raises RuntimeError when set twice and
    ValueError for a tool SOK does not know."""
    if tool not in _TOOLS:
        raise ValueError("set_comm_tool(%r): SOK's tool is 'horovod' (sok1x talks MPI)" % (tool,))
    if _tool[0] is not None:
        raise RuntimeError("the communication tool cannot be set more than once")
    _tool[0] = tool


def check_comm_tool():
    """Raises RuntimeError unless sok1x is up."""
    if not runtime.is_initialized():
        raise RuntimeError("sok1x is not up: call sok1x.init() (or run sok1x.Init()) first")


def _up():
    check_comm_tool()
    return runtime.get()


def rank():
    """This process's rank."""
    return _up().rank


def num_ranks():
    """The number of processes in the job."""
    return _up().size


def local_rank():
    """This process's rank among those of its host."""
    return _up().group.local_rank


def id_in_rank():
    """The GPU's index in its process: 0 (one GPU per process)."""
    _up()
    return 0


def num_gpu_per_rank():
    """GPUs per process: 1."""
    _up()
    return 1


def global_gpu_id():
    """This GPU's index in the job: the rank."""
    return rank()


def num_gpus():
    """GPUs in the job: the number of ranks."""
    return num_ranks()


def allreduce(tensor, op="sum"):
    """Returns `tensor` summed ("sum") or averaged ("average") over the ranks (sok1x.allreduce);
    raises ValueError for another op."""
    if op not in ("sum", "average"):
        raise ValueError("communication.allreduce: op %r; sok1x reduces with 'sum' or "
                         "'average'" % (op,))
    from sok1x.graph_ops.collective_ops import allreduce as sok1x_allreduce
    return sok1x_allreduce(tensor, average=(op == "average"))


__all__ = ["allreduce", "check_comm_tool", "global_gpu_id", "id_in_rank", "local_rank",
           "num_gpu_per_rank", "num_gpus", "num_ranks", "rank", "set_comm_tool"]
