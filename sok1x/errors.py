"""Every exception sok1x raises. Messages name the layer, variable or rank involved, and the fix."""


class Sok1xError(RuntimeError):
    """Base class of all sok1x errors."""


class NotInitializedError(Sok1xError):
    """sok1x was used before sok1x.Init() / sok1x.init() ran."""


class InitError(Sok1xError):
    """The process group, device or communicator could not be brought up."""


class InvalidInputError(Sok1xError, ValueError):
    """Bad keys or shapes given to an embedding op (D7: raised on every rank in the same step)."""


class TableFullError(Sok1xError):
    """A shard's hash table has no free row left for a new key."""


class DeviceMemoryError(Sok1xError, MemoryError):
    """The GPU has no room for a table or a step's buffers."""


class OrderError(Sok1xError):
    """Ranks reached different collectives, or two towers were run together."""


class CommError(Sok1xError):
    """A collective failed (MPI or NCCL); the message names the call."""


class UnsupportedOptimizerError(Sok1xError, TypeError):
    """An optimizer that sok1x cannot apply to an embedding variable."""


class CheckpointError(Sok1xError):
    """A checkpoint file is missing, corrupt or does not match the variable."""


class LaunchError(Sok1xError):
    """sok1x-run could not find or drive an MPI launcher."""


class CaptureError(Sok1xError):
    """Work that cannot be recorded in a CUDA graph was queued during a capture of the sok1x
    stream (a host wait, an upload), or the driver refused the capture."""
